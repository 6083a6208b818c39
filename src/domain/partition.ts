/** PROTOCOL.md: the partition of a user is fnv1a32(utf8(user)) mod P. */

const fnvOffsetBasis = 2166136261
const fnvPrime = 16777619

export const fnv1a32 = (bytes: Uint8Array): number => {
  let hash = fnvOffsetBasis
  for (let index = 0; index < bytes.length; index += 1) {
    hash ^= bytes[index] as number
    hash = Math.imul(hash, fnvPrime) >>> 0
  }
  return hash >>> 0
}

const step = (hash: number, byte: number): number => Math.imul(hash ^ byte, fnvPrime) >>> 0

/**
 * fnv1a32 of the string's UTF-8 bytes, encoded on the fly: the partition is computed several times per
 * command (decode, ownership check, write fence), and a TextEncoder buffer for each showed in profiles.
 * Encodes exactly as TextEncoder does, a lone surrogate included (as U+FFFD); test/domain/partition.test.ts
 * compares the two.
 */
export const fnv1a32OfString = (text: string): number => {
  let hash = fnvOffsetBasis
  for (let index = 0; index < text.length; index += 1) {
    let code = text.charCodeAt(index)
    if (code < 0x80) {
      hash = step(hash, code)
      continue
    }
    if (code < 0x800) {
      hash = step(step(hash, 0xc0 | (code >> 6)), 0x80 | (code & 0x3f))
      continue
    }
    if (code >= 0xd800 && code <= 0xdfff) {
      const next = index + 1 < text.length ? text.charCodeAt(index + 1) : 0
      if (code <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
        code = 0x10000 + ((code - 0xd800) << 10) + (next - 0xdc00)
        index += 1
        hash = step(step(hash, 0xf0 | (code >> 18)), 0x80 | ((code >> 12) & 0x3f))
        hash = step(step(hash, 0x80 | ((code >> 6) & 0x3f)), 0x80 | (code & 0x3f))
        continue
      }
      code = 0xfffd
    }
    hash = step(step(step(hash, 0xe0 | (code >> 12)), 0x80 | ((code >> 6) & 0x3f)), 0x80 | (code & 0x3f))
  }
  return hash >>> 0
}

export const partitionOf = (user: string, partitions: number): number => fnv1a32OfString(user) % partitions
