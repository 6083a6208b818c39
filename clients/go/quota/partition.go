package quota

import "unicode/utf8"

// PROTOCOL.md "Subjects": the partition of a user is fnv1a32(utf8(user)) mod P, FNV-1a 32-bit with
// offset basis 2166136261 and prime 16777619 (the hash of nats-server's partition() mapping).
const (
	fnvOffsetBasis uint32 = 2166136261
	fnvPrime       uint32 = 16777619
)

// FNV1a32 is the 32-bit FNV-1a hash of the user as it goes on the wire. For valid UTF-8 that is its
// bytes. A Go string may hold invalid UTF-8, which encoding/json replaces byte by byte with U+FFFD
// when it encodes the command: the hash does the same, so the subject's partition is the one the
// coordinator computes from the user it receives (otherwise it would answer wrong_partition).
func FNV1a32(user string) uint32 {
	hash := fnvOffsetBasis
	for index := 0; index < len(user); {
		r, size := utf8.DecodeRuneInString(user[index:])
		if r == utf8.RuneError && size == 1 {
			hash = fnvStep(fnvStep(fnvStep(hash, 0xef), 0xbf), 0xbd)
			index++
			continue
		}
		for end := index + size; index < end; index++ {
			hash = fnvStep(hash, user[index])
		}
	}
	return hash
}

func fnvStep(hash uint32, b byte) uint32 {
	return (hash ^ uint32(b)) * fnvPrime
}

// Partition is the partition of user among partitions (the deployment's QUOTA_PARTITIONS, at least 1).
func Partition(user string, partitions int) int {
	return int(FNV1a32(user) % uint32(partitions))
}
