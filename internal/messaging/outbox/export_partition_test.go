package outbox

// The partition function's Go half, for the test that holds it to the SQL
// half.
var HashText = hashText
