// Package failover drives the order flow through PostgreSQL failovers
// under Patroni and accounts for every order and message afterwards: what
// test/e2e's failover tests assert and lab/failover measures, one harness
// for both.
//
// The caller runs order-api, an outbox-relay and order-consumer on a
// testenv.PatroniCluster (its multi-host URL, target_session_attrs=
// read-write), in the relay mode of Mode; this package gives the cluster's
// options and the relay's settings for that mode (Mode.Cluster,
// Mode.RelayEnv), places orders at a steady rate (StartLoad), copies
// every message the relay publishes (StartTap), fails the cluster over,
// killing its leader and switching over in turn (Failover), and then
// checks the promise and measures each failover (Account, Measure).
//
// The functions take a testing.TB, as testenv's do: a test's, or the lab
// command's own.
package failover
