/** PROTOCOL.md: the partition of a user is fnv1a32(utf8(user)) mod P. */

const fnvOffsetBasis = 2166136261
const fnvPrime = 16777619
const encoder = new TextEncoder()

export const fnv1a32 = (bytes: Uint8Array): number => {
  let hash = fnvOffsetBasis
  for (const byte of bytes) {
    hash ^= byte
    hash = Math.imul(hash, fnvPrime) >>> 0
  }
  return hash >>> 0
}

export const partitionOf = (user: string, partitions: number): number =>
  fnv1a32(encoder.encode(user)) % partitions
