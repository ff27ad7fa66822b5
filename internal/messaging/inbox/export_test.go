package inbox

import "context"

// SetAfterCommit makes cs call f between a delivery's commit and its ack.
func SetAfterCommit(cs *Consumers, f func(*Delivery)) { cs.afterCommit = f }

// SetExit replaces os.Exit for the crash-after-commit fault.
func SetExit(cs *Consumers, exit func(int)) { cs.exit = exit }

// ReplayAs is Replay under the replay id id.
func ReplayAs(ctx context.Context, amqpURL, consumer string, r ReplayRequest, id string) ([]string, error) {
	lot, err := openParkingLot(ctx, amqpURL, consumer, "replay")
	if err != nil {
		return nil, err
	}
	defer lot.close()
	pub, err := newConfirmPublisher(lot.conn)
	if err != nil {
		return nil, err
	}
	return replay(ctx, lot, pub, r, id)
}

// KillPublisherChannels closes the channel each consumer publishes its
// retries and parkings on, as the broker does when it refuses a publish.
func KillPublisherChannels(cs *Consumers) {
	for _, c := range cs.loops {
		if p := c.pub.Load(); p != nil {
			p.mu.Lock()
			_ = p.ch.Close()
			p.mu.Unlock()
		}
	}
}
