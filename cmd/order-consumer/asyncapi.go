package main

import (
	"io"

	"github.com/yourorg/orders/internal/config"
	"github.com/yourorg/orders/internal/consumer"
)

// writeAsyncAPI writes api/asyncapi.yaml: every consumer, with the queue
// settings of the defaults (not of this environment), so that the
// committed document does not depend on who generated it.
func writeAsyncAPI(w io.Writer) error {
	var defaults Config
	if err := config.Load(&defaults, map[string]string{}); err != nil {
		return err
	}
	return consumer.WriteAsyncAPI(w, consumer.All(consumer.Deps{}), consumer.Queues{
		RetryDelays: defaults.RetryDelays, DeliveryLimit: defaults.DeliveryLimit,
	})
}
