//go:build !linux

package fence

func ready() bool { return !plainStore }

func heavy() {}

func sharedReady() bool { return !plainStore }

func sharedHeavy() {}
