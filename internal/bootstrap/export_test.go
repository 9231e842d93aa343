package bootstrap

// Stall stops (or restarts) w's reader, as a stopped process stops
// reading: its pings go unanswered.
func (w *Watch) Stall(on bool) { w.stalled.Store(on) }
