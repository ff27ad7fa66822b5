package outbox

import "math/bits"

// PartitionOf is the partition of an aggregate's messages among
// partitions: the SQL function outbox_partition (migrations/
// 00005_partition_function.sql), mod(hashtext(aggregateID) + 2^31,
// partitions), computed here without a round trip (the log-tailing relay
// stamps its rows with it). hashtext is
// PostgreSQL's hash_bytes (src/common/hashfn.c, Bob Jenkins' lookup3) on a
// little-endian server; the test holds the two to the same answers.
func PartitionOf(aggregateID string, partitions int) int {
	return partitionOfHash(aggregateHash(aggregateID), partitions)
}

// hashText is PostgreSQL's hash_bytes.
func hashText(k []byte) uint32 {
	rot := bits.RotateLeft32
	a := 0x9e3779b9 + uint32(len(k)) + 3923095
	b, c := a, a
	for ; len(k) >= 12; k = k[12:] {
		a += le32(k[0:4])
		b += le32(k[4:8])
		c += le32(k[8:12])
		a -= c
		a ^= rot(c, 4)
		c += b
		b -= a
		b ^= rot(a, 6)
		a += c
		c -= b
		c ^= rot(b, 8)
		b += a
		a -= c
		a ^= rot(c, 16)
		c += b
		b -= a
		b ^= rot(a, 19)
		a += c
		c -= b
		c ^= rot(b, 4)
		b += a
	}
	var tail [12]byte
	copy(tail[:], k)
	a += le32(tail[0:4])
	b += le32(tail[4:8])
	c += le32(tail[8:12]) << 8 // the lowest byte of c is the length's, in lookup3
	c ^= b
	c -= rot(b, 14)
	a ^= c
	a -= rot(c, 11)
	b ^= a
	b -= rot(a, 25)
	c ^= b
	c -= rot(b, 16)
	a ^= c
	a -= rot(c, 4)
	b ^= a
	b -= rot(a, 14)
	c ^= b
	c -= rot(b, 24)
	return c
}

// le32 reads 4 bytes as a little-endian uint32.
func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
