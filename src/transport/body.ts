/**
 * A request body to the commands it carries, or the reason it gets the NATS service error 400
 * (PROTOCOL.md "Messages"): larger than 1 MiB, not UTF-8 JSON, not an object or array, or a batch over
 * 1000 commands. Whatever is inside the object or array is judged per command (decode.ts).
 *
 * Before JSON.parse, one pass over the bytes measures how deep arrays and objects nest and how many
 * elements a top-level array has: a body nested past messageNestingDepthMax, or a batch over the
 * limit, is refused without building what JSON.parse would build (hundreds of ms for 1 MiB of `[`).
 */
import { batchCommandsMax, messageBytesMax, messageNestingDepthMax } from "../domain/limits.js"

export type ParsedBody =
  | { readonly kind: "refused"; readonly reason: string }
  | { readonly kind: "single"; readonly command: unknown }
  | { readonly kind: "batch"; readonly commands: ReadonlyArray<unknown> }

/** `fatal`: invalid UTF-8 is refused rather than silently turned into U+FFFD inside an id. */
const utf8 = new TextDecoder("utf-8", { fatal: true })

/** Header values may not hold CR or LF (nats.js throws); control characters are replaced too. */
export const headerSafe = (text: string): string =>
  Array.from(text.slice(0, 256), (char) => (char < " " || char === "\u007f" ? " " : char)).join("")

const quote = 0x22
const backslash = 0x5c
const comma = 0x2c
const openBracket = 0x5b
const closeBracket = 0x5d
const openBrace = 0x7b
const closeBrace = 0x7d
const space = 0x20
const tab = 0x09
const lineFeed = 0x0a
const carriageReturn = 0x0d

/** What the pass over the raw bytes found, before anything is parsed. */
export type BodyShape =
  | { readonly nestedTooDeep: true }
  | { readonly nestedTooDeep: false; readonly topLevelElements: number | undefined }

/**
 * Nesting depth and the top-level array's element count, from the bytes: `[` and `{` outside strings
 * open a level, `]` and `}` close one, and commas directly inside a top-level array separate its
 * elements. Byte-wise is exact for UTF-8: no byte of a multi-byte character is `"`, `\`, or a bracket.
 * Stops at the first level past `depthMax`. A body that is not JSON may be counted wrongly: parsing it
 * refuses it anyway.
 */
export const scanBodyShape = (data: Uint8Array, depthMax: number): BodyShape => {
  let depth = 0
  let inString = false
  let topLevelArray = false
  let commas = 0
  let topLevelValue = false
  for (let index = 0; index < data.length; index += 1) {
    const byte = data[index]!
    if (inString) {
      if (byte === backslash) index += 1
      else if (byte === quote) inString = false
      continue
    }
    if (byte === openBracket || byte === openBrace) {
      if (depth === 0) topLevelArray = byte === openBracket
      else if (depth === 1) topLevelValue = true
      depth += 1
      if (depth > depthMax) return { nestedTooDeep: true }
    } else if (byte === closeBracket || byte === closeBrace) {
      depth -= 1
    } else if (depth === 1) {
      if (byte === comma) commas += 1
      else if (byte !== space && byte !== tab && byte !== lineFeed && byte !== carriageReturn)
        topLevelValue = true
      if (byte === quote) inString = true
    } else if (byte === quote) {
      inString = true
    }
  }
  return {
    nestedTooDeep: false,
    topLevelElements: topLevelArray ? (topLevelValue ? commas + 1 : 0) : undefined
  }
}

const batchOverLimit = (commands: number): ParsedBody => ({
  kind: "refused",
  reason: `batch of ${commands} commands is over the limit of ${batchCommandsMax}`
})

export const parseBody = (data: Uint8Array, bytesMax: number = messageBytesMax): ParsedBody => {
  if (data.length > bytesMax) {
    return { kind: "refused", reason: `message of ${data.length} bytes is larger than ${bytesMax}` }
  }
  const shape = scanBodyShape(data, messageNestingDepthMax)
  if (shape.nestedTooDeep)
    return {
      kind: "refused",
      reason: `body nests arrays and objects deeper than ${messageNestingDepthMax} levels`
    }
  if (shape.topLevelElements !== undefined && shape.topLevelElements > batchCommandsMax)
    return batchOverLimit(shape.topLevelElements)
  let json: unknown
  try {
    json = JSON.parse(utf8.decode(data))
  } catch (error) {
    const what = error instanceof SyntaxError ? `not JSON (${error.message})` : "not UTF-8"
    return { kind: "refused", reason: headerSafe(`body is ${what}`) }
  }
  if (Array.isArray(json)) {
    // The scan counted the elements already; this holds if it ever counted wrong.
    return json.length > batchCommandsMax ? batchOverLimit(json.length) : { kind: "batch", commands: json }
  }
  if (typeof json === "object" && json !== null) return { kind: "single", command: json }
  return { kind: "refused", reason: "body must be a command object or an array of command objects" }
}
