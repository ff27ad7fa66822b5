package outboxtest

import "testing"

// suite is the contract every relay meets, whatever its rows' source: run
// against the polling relay by package outbox's tests and against the
// log-tailing relay by package wal's. A test of what only the polling
// relay does skips itself in another mode (Bundle.PollOnly).
var suite = []struct {
	name string
	test func(t *testing.T, mode Mode)
}{
	{"TestRelayPublishesTheEnvelope", testRelayPublishesTheEnvelope},
	{"TestThreeRelaysShareTheBacklog", testThreeRelaysShareTheBacklog},
	{"TestCrashBetweenConfirmAndMarkRepublishesSameMessageID", alsoThroughPgBouncer(testCrashBetweenConfirmAndMarkRepublishesSameMessageID)},
	{"TestUnroutableMessageEndsFailedWhileOthersFlow", testUnroutableMessageEndsFailedWhileOthersFlow},
	{"TestBrokerDownNothingMarkedEverythingPublishedAfter", testBrokerDownNothingMarkedEverythingPublishedAfter},
	{"TestConnectionLostMidBacklog", testConnectionLostMidBacklog},
	{"TestConfirmTimeoutRetries", testConfirmTimeoutRetries},
	{"TestShutdownHandsBackUnconfirmedRows", testShutdownHandsBackUnconfirmedRows},
	{"TestCommitOrderAndRollbacks", testCommitOrderAndRollbacks},
	{"TestNotifyWakesTheRelay", testNotifyWakesTheRelay},
	{"TestDatabaseConnectionsKilled", alsoThroughPgBouncer(testDatabaseConnectionsKilled)},
	{"TestReturnsAreNeverLostWhileMarksWait", testReturnsAreNeverLostWhileMarksWait},
	{"TestBrokerTroubleNeverSpendsAttempts", testBrokerTroubleNeverSpendsAttempts},
	{"TestBrokerNackSpendsNoAttempt", testBrokerNackSpendsNoAttempt},
	{"TestLiveRelayThatOutlivesItsLease", testLiveRelayThatOutlivesItsLease},
	{"TestBlockedBrokerPausesClaiming", testBlockedBrokerPausesClaiming},
	{"TestMessagesOfOneAggregateGoOutInOrder", testMessagesOfOneAggregateGoOutInOrder},
	{"TestRelaysSharePartitions", testRelaysSharePartitions},
	{"TestPartitionedMessagesCarryTheirPartitionInOrder", testPartitionedMessagesCarryTheirPartitionInOrder},
	{"TestARelayThatJoinsLaterGetsItsShare", testARelayThatJoinsLaterGetsItsShare},
	{"TestAnAggregatesMessagesGoOutInTheOrderTheyCommitted", testAnAggregatesMessagesGoOutInTheOrderTheyCommitted},
	{"TestRelayHoldsATypeUntilEveryReaderHasItsQueue", testRelayHoldsATypeUntilEveryReaderHasItsQueue},
	{"TestAReaderThatBindsLateGetsEveryMessage", testAReaderThatBindsLateGetsEveryMessage},
	{"TestABacklogAcrossTimePartitionsGoesOutInOrder", testABacklogAcrossTimePartitionsGoesOutInOrder},
	{"TestATimePartitionMadeWhileRunningIsPublished", testATimePartitionMadeWhileRunningIsPublished},
}

// alsoThroughPgBouncer runs test twice, in subtests: with the relays'
// pools straight to the test's database ("direct"), and through PgBouncer
// (Mode.ThroughPgBouncer).
func alsoThroughPgBouncer(test func(t *testing.T, mode Mode)) func(t *testing.T, mode Mode) {
	return func(t *testing.T, mode Mode) {
		t.Parallel()
		t.Run("direct", func(t *testing.T) { test(t, mode) })
		t.Run("through PgBouncer", func(t *testing.T) { test(t, mode.ThroughPgBouncer()) })
	}
}

// Run runs the suite against the relays of mode, each test in a subtest
// of its own, named as docs/ name it.
func Run(t *testing.T, mode Mode) {
	for _, tc := range suite {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, mode) })
	}
}
