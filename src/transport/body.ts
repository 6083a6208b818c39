/**
 * A request body to the commands it carries, or the reason it gets the NATS service error 400
 * (PROTOCOL.md "Messages"): larger than 1 MiB, not UTF-8 JSON, not an object or array, or a batch over
 * 1000 commands. Whatever is inside the object or array is judged per command (decode.ts).
 */
import { batchCommandsMax, messageBytesMax } from "../domain/limits.js"

export type ParsedBody =
  | { readonly kind: "refused"; readonly reason: string }
  | { readonly kind: "single"; readonly command: unknown }
  | { readonly kind: "batch"; readonly commands: ReadonlyArray<unknown> }

/** `fatal`: invalid UTF-8 is refused rather than silently turned into U+FFFD inside an id. */
const utf8 = new TextDecoder("utf-8", { fatal: true })

/** Header values may not hold CR or LF (nats.js throws); control characters are replaced too. */
export const headerSafe = (text: string): string =>
  Array.from(text.slice(0, 256), (char) => (char < " " || char === "\u007f" ? " " : char)).join("")

export const parseBody = (data: Uint8Array, bytesMax: number = messageBytesMax): ParsedBody => {
  if (data.length > bytesMax) {
    return { kind: "refused", reason: `message of ${data.length} bytes is larger than ${bytesMax}` }
  }
  let json: unknown
  try {
    json = JSON.parse(utf8.decode(data))
  } catch (error) {
    const what = error instanceof SyntaxError ? `not JSON (${error.message})` : "not UTF-8"
    return { kind: "refused", reason: headerSafe(`body is ${what}`) }
  }
  if (Array.isArray(json)) {
    return json.length > batchCommandsMax
      ? {
          kind: "refused",
          reason: `batch of ${json.length} commands is over the limit of ${batchCommandsMax}`
        }
      : { kind: "batch", commands: json }
  }
  if (typeof json === "object" && json !== null) return { kind: "single", command: json }
  return { kind: "refused", reason: "body must be a command object or an array of command objects" }
}
