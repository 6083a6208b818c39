/**
 * The vectors shared with the Go client (clients/testdata/vectors.json; clients/go/quota/vectors_test.go
 * reads the same file): every status of PROTOCOL.md and what `withHold`/`withSlot` do with it, and the
 * error each helper raises for a reply, with its fields and message. Partition hashes: partitionVectors.test.ts.
 */
import { readFileSync } from "node:fs"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { QuotaClient } from "../../src/client/index.js"
import type { Status } from "../../src/client/index.js"
import type { Answer, Command } from "./fakeCoordinator.js"
import { FakeCoordinator, natsUrl, randomPrefix } from "./fakeCoordinator.js"

/** "granted": the work runs; otherwise the error class (`_tag`) the helper rejects with. */
type HelperVector = "granted" | { readonly ts: string }

interface StatusVector {
  readonly status: string
  readonly kind: "grant" | "refusal" | "error" | "retried"
  readonly reply?: Readonly<Record<string, unknown>>
  readonly withHold?: HelperVector
  readonly withSlot?: HelperVector
}

interface ErrorShapeVector {
  readonly note: string
  readonly helper: "withHold" | "withSlot"
  readonly input: Readonly<Record<string, unknown>>
  readonly reply: Answer
  readonly ts: { readonly error: string; readonly fields: Readonly<Record<string, unknown>> }
  readonly messageContains: ReadonlyArray<string>
}

const { statuses, errorShapes } = JSON.parse(
  readFileSync(new URL("../../clients/testdata/vectors.json", import.meta.url), "utf8")
) as { readonly statuses: ReadonlyArray<StatusVector>; readonly errorShapes: ReadonlyArray<ErrorShapeVector> }

/** Every status of the client's `Status` type: the compiler rejects a missing or an extra one. */
const clientStatuses: Record<Status, null> = {
  reserved: null,
  consumed: null,
  committed: null,
  released: null,
  extended: null,
  exists: null,
  conflict: null,
  closed: null,
  insufficient_quota: null,
  unknown_meter: null,
  not_found: null,
  adjusted: null,
  acquired: null,
  busy: null,
  renewed: null,
  ok: null,
  unknown_plan: null,
  invalid_request: null,
  wrong_partition: null,
  limit_reached: null,
  unavailable: null,
  overloaded: null
}

const prefix = randomPrefix("vectors")
const partitions = 8
/** What reserve and acquire_slot are answered; the helpers' commit, release and renewals succeed. */
let reply: Answer = { status: "reserved" }
const answer = (command: Command): Answer => {
  switch (command.op) {
    case "reserve":
    case "acquire_slot":
      return reply
    case "commit":
      return { status: "committed" }
    case "renew_slot":
      return { status: "renewed", limit: 2, held: 1 }
    default:
      return { status: "released", limit: 2, held: 0 }
  }
}

let fake: FakeCoordinator
let client: QuotaClient
beforeAll(async () => {
  fake = await FakeCoordinator.start({ prefix, partitions, answer })
  client = await QuotaClient.connect({
    servers: natsUrl,
    prefix,
    partitions,
    retry: { attemptsMax: 2, baseDelayMs: 1, delayMsMax: 1 }
  })
})
afterAll(async () => {
  await client.close()
  await fake.stop()
})

const text = (input: Readonly<Record<string, unknown>>, key: string): string => String(input[key])

/** Runs the helper; resolves with whether the work ran and what it rejected with. */
const runHelper = async (
  helper: "withHold" | "withSlot",
  input: Readonly<Record<string, unknown>>
): Promise<{ readonly ran: boolean; readonly error: unknown }> => {
  let ran = false
  const work = async () => {
    ran = true
    return 1
  }
  try {
    if (helper === "withHold") {
      const hold = { user: text(input, "user"), meter: text(input, "meter"), id: text(input, "id") }
      await client.withHold({ ...hold, amount: Number(input.amount) }, work)
    } else {
      await client.withSlot({ user: text(input, "user"), job: text(input, "job") }, work)
    }
    return { ran, error: undefined }
  } catch (error) {
    return { ran, error }
  }
}

describe("status vectors shared with the Go client", () => {
  it("are the client's statuses, each named in PROTOCOL.md", () => {
    const protocol = readFileSync(new URL("../../docs/PROTOCOL.md", import.meta.url), "utf8")
    expect(statuses.map((vector) => vector.status).sort()).toEqual(Object.keys(clientStatuses).sort())
    for (const { status } of statuses) expect(protocol).toContain(`\`${status}\``)
  })

  const helperCases = statuses.flatMap((vector) =>
    (["withHold", "withSlot"] as const).flatMap((helper) => {
      const want = vector[helper]
      return want === undefined ? [] : [[`${helper} ${vector.status}`, helper, vector, want] as const]
    })
  )

  it("cover the helpers", () => {
    expect(helperCases.length).toBeGreaterThanOrEqual(15)
  })

  it.each(helperCases)("%s", async (_name, helper, vector, want) => {
    reply = { ...vector.reply, status: vector.status }
    const input = { user: "acct-42", meter: "tokens", amount: 5, id: "job-7", job: "job-7" }
    const { ran, error } = await runHelper(helper, input)
    if (want === "granted") {
      expect({ ran, error }).toEqual({ ran: true, error: undefined })
    } else {
      expect(ran).toBe(false)
      expect((error as { readonly _tag?: string } | undefined)?._tag).toBe(want.ts)
    }
  })
})

describe("error shapes shared with the Go client", () => {
  it("has shapes", () => {
    expect(errorShapes.length).toBeGreaterThanOrEqual(4)
  })

  it.each(errorShapes.map((shape) => [shape.note, shape] as const))("%s", async (_note, shape) => {
    reply = shape.reply
    const { ran, error } = await runHelper(shape.helper, shape.input)
    expect(ran).toBe(false)
    expect((error as { readonly _tag?: string } | undefined)?._tag).toBe(shape.ts.error)
    expect(error).toMatchObject(shape.ts.fields)
    for (const part of shape.messageContains) expect((error as Error).message).toContain(part)
  })
})
