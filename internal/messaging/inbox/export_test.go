package inbox

import "context"

// AfterCommit is a Faults whose AfterCommit calls the function.
type AfterCommit func(*Delivery)

func (f AfterCommit) AfterCommit(_ context.Context, d *Delivery) { f(d) }

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
	for _, s := range cs.subscriptions {
		if p := s.pub.Load(); p != nil {
			p.mu.Lock()
			_ = p.ch.Close()
			p.mu.Unlock()
		}
	}
}
