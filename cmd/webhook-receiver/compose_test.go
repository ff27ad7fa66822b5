package main

import (
	"slices"
	"testing"

	"github.com/yourorg/orders/internal/testenv"
)

// docker-compose.yml gives webhook-receiver only variables it reads.
func TestComposeSetsOnlyVariablesItReads(t *testing.T) {
	t.Parallel()
	services := testenv.ComposeServicesOf(testenv.Compose(t), "webhook-receiver")
	if len(services) == 0 {
		t.Fatal("no service of docker-compose.yml runs webhook-receiver")
	}
	for _, svc := range services {
		for name := range svc.Environment {
			if !slices.Contains([]string{"WEBHOOK_ADDR", "FAIL_FIRST"}, name) {
				t.Errorf("service %s sets %s, which webhook-receiver does not read", svc.Name, name)
			}
		}
	}
}
