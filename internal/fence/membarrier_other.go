//go:build !linux

package fence

func ready() bool { return !plainStore }

func heavy() bool { return !plainStore }

func sharedReady() bool { return !plainStore }

func sharedHeavy() bool { return !plainStore }
