package inbox

// SetAfterCommit makes cs call f between a delivery's commit and its ack.
func SetAfterCommit(cs *Consumers, f func(*Delivery)) { cs.afterCommit = f }

// SetExit replaces os.Exit for the crash-after-commit fault.
func SetExit(cs *Consumers, exit func(int)) { cs.exit = exit }
