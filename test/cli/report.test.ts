/**
 * `quota-coordinator report METER [PERIOD] [--format csv|jsonl]` without the server: its arguments,
 * its CSV quoting (RFC 4180, checked by parsing what it writes back), and the command line against a
 * stand-in coordinator on the real nats-server that answers `list_usage` in pages: what it writes,
 * that it writes page by page and waits for a slow reader, its progress line, and its exit codes.
 * test/cli/reportCoordinator.test.ts runs it against the real coordinator.
 */
import fc from "fast-check"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { CliIo } from "../../src/cli/cli.js"
import { runCli } from "../../src/cli/cli.js"
import { parsePeriod, reportRequest, UsageError } from "../../src/cli/operator.js"
import { csvField, reportLines } from "../../src/cli/operatorOutput.js"
import type { Answer, Command } from "../client/fakeCoordinator.js"
import { FakeCoordinator, natsUrl, randomPrefix } from "../client/fakeCoordinator.js"

/** RFC 4180's grammar, read back: records of fields, CRLF between records, quoted fields may hold anything. */
const parseCsv = (text: string): Array<Array<string>> => {
  const records: Array<Array<string>> = []
  let fields: Array<string> = []
  let position = 0
  for (;;) {
    let field = ""
    if (text[position] === '"') {
      position += 1
      for (;;) {
        const quote = text.indexOf('"', position)
        if (quote < 0) throw new Error("unterminated quoted field")
        field += text.slice(position, quote)
        position = quote + 1
        if (text[position] !== '"') break
        field += '"'
        position += 1
      }
    } else {
      const end = text.slice(position).search(/[,\r\n"]/)
      const stop = end < 0 ? text.length : position + end
      if (text[stop] === '"' || text[stop] === "\n") throw new Error(`raw quote or LF at ${stop}`)
      field = text.slice(position, stop)
      position = stop
    }
    fields.push(field)
    if (text[position] === ",") {
      position += 1
      continue
    }
    if (text.startsWith("\r\n", position)) {
      records.push(fields)
      fields = []
      position += 2
      if (position === text.length) return records
      continue
    }
    throw new Error(`expected , or CRLF at ${position}`)
  }
}

describe("report's arguments", () => {
  it("PERIOD: YYYY-MM is the month's start, YYYY-MM-DD the day's, - or nothing no period", () => {
    expect(parsePeriod("2026-10")).toBe(Date.UTC(2026, 9, 1))
    expect(parsePeriod("2026-02-28")).toBe(Date.UTC(2026, 1, 28))
    expect(parsePeriod("2028-02-29")).toBe(Date.UTC(2028, 1, 29))
    expect(parsePeriod("-")).toBeNull()
    expect(parsePeriod(undefined)).toBeNull()
  })

  it("refuses a PERIOD that is no month or day, naming the three forms", () => {
    for (const bad of [
      "2026-13",
      "2026-00",
      "2026-02-30",
      "2027-02-29",
      "2026-1",
      "26-10",
      "1969-12",
      "oct",
      "2026-10-1",
      ""
    ])
      expect(() => parsePeriod(bad), bad).toThrow(
        /PERIOD must be YYYY-MM \(a month meter\), YYYY-MM-DD \(a day meter\) or - \(a none meter\)/
      )
  })

  it("takes METER and an optional PERIOD; --format csv (default) or jsonl", () => {
    expect(reportRequest(["tokens", "2026-10"], {})).toEqual({
      meter: "tokens",
      periodStart: Date.UTC(2026, 9, 1),
      format: "csv",
      pageSize: undefined
    })
    expect(reportRequest(["storage_bytes"], { format: "jsonl", pageSize: "1000" })).toEqual({
      meter: "storage_bytes",
      periodStart: null,
      format: "jsonl",
      pageSize: 1000
    })
    for (const bad of ["0", "1001", "-1", "2.5", "x"])
      expect(() => reportRequest(["tokens"], { pageSize: bad }), bad).toThrow(
        `--page-size must be an integer from 1 to 1000, got ${JSON.stringify(bad)}`
      )
    expect(() => reportRequest([], {})).toThrow(new UsageError("missing METER"))
    expect(() => reportRequest(["tokens", "2026-10", "x"], {})).toThrow(/unexpected argument "x"/)
    expect(() => reportRequest(["Tokens"], {})).toThrow(/METER must match/)
    expect(() => reportRequest(["tokens"], { format: "xml" })).toThrow(
      /--format must be csv or jsonl, got "xml"/
    )
  })
})

describe("report's CSV", () => {
  it("quotes a field with a comma, quote, CR or LF, doubling its quotes, and leaves the others as they are", () => {
    expect(csvField("acct-42")).toBe("acct-42")
    expect(csvField("日本 ümlaut")).toBe("日本 ümlaut")
    expect(csvField("a,b")).toBe('"a,b"')
    expect(csvField('say "hi"')).toBe('"say ""hi"""')
    expect(csvField("two\nlines")).toBe('"two\nlines"')
    expect(csvField("cr\rhere")).toBe('"cr\rhere"')
    expect(csvField(" padded ")).toBe(" padded ")
  })

  it("reads back, by RFC 4180's grammar, exactly the users and figures written, whatever the users hold", () => {
    fc.assert(
      fc.property(
        fc.array(fc.record({ user: fc.string({ unit: "binary", minLength: 1 }), used: fc.nat() }), {
          maxLength: 20
        }),
        (usage) => {
          const lines = `user,meter,periodStart,used\r\n${reportLines("csv", "tokens", Date.UTC(2026, 9, 1), usage, false)}`
          expect(parseCsv(lines)).toEqual([
            ["user", "meter", "periodStart", "used"],
            ...usage.map((row) => [row.user, "tokens", "2026-10-01", String(row.used)])
          ])
        }
      )
    )
  })

  it("JSON lines carry periodStart as events do (ms, or null) and the exact users", () => {
    const users = [{ user: 'q"\u001b\u202e', used: 3 }]
    const lines = reportLines("jsonl", "storage_bytes", null, users, false).split("\n")
    expect(lines.at(-1)).toBe("")
    expect(JSON.parse(lines[0]!)).toEqual({
      user: 'q"\u001b\u202e',
      meter: "storage_bytes",
      periodStart: null,
      used: 3
    })
    // Inert on a terminal all the same: the bidi override is written as its JSON escape.
    expect(lines[0]).not.toContain("\u202e")
  })
})

const partitions = 16
let fake: FakeCoordinator
let prefix: string
/** What the stand-in answers `list_usage` of a partition; by default nothing listed. */
let answerList: (partition: number, command: Command) => Answer

beforeAll(async () => {
  prefix = randomPrefix("report")
  fake = await FakeCoordinator.start({
    prefix,
    partitions,
    answer: (command, stand) =>
      command.op === "list_usage" ? answerList(stand.received.at(-1)!.partition, command) : undefined
  })
})

afterAll(() => fake?.stop())

interface Ran {
  readonly code: number
  readonly stdout: string
  readonly stderr: string
}

const report = async (
  args: ReadonlyArray<string>,
  io: Partial<CliIo> = {},
  env: Record<string, string> = {}
) => {
  let stdout = ""
  let stderr = ""
  const code = await runCli(["report", ...args], {
    env: {
      ...process.env,
      NATS_URL: natsUrl,
      QUOTA_PREFIX: prefix,
      QUOTA_PARTITIONS: String(partitions),
      ...env
    },
    stdout: (text) => (stdout += text),
    stderr: (text) => (stderr += text),
    ...io
  })
  return { code, stdout, stderr } satisfies Ran
}

/** Three users in partition 2 (a page of 2, then 1), one in partition 9, in UTF-8 byte order. */
const pagesOf = (partition: number, command: Command): Answer => {
  const rows: Record<number, Array<{ user: string; used: number }>> = {
    2: [
      { user: "a,b", used: 10 },
      { user: 'say "hi"', used: 20 },
      { user: "ümlaut", used: 30 }
    ],
    9: [{ user: "日本", used: 40 }]
  }
  const all = rows[partition] ?? []
  const start = command["after"] === undefined ? 0 : all.findIndex((row) => row.user === command["after"]) + 1
  return { status: "ok", usage: all.slice(start, start + 2), more: start + 2 < all.length }
}

describe("quota-coordinator report against a stand-in coordinator", () => {
  it("writes the CSV header alone when no user has usage", async () => {
    answerList = () => ({ status: "ok", usage: [], more: false })
    expect(await report(["tokens", "2026-10"])).toEqual({
      code: 0,
      stdout: "user,meter,periodStart,used\r\n",
      stderr: ""
    })
  })

  it("writes the CSV header and every partition's users, paged, with exit 0 and nothing on stderr", async () => {
    answerList = pagesOf
    const before = fake.received.length
    const ran = await report(["tokens", "2026-10"])
    expect(ran).toEqual({
      code: 0,
      stdout:
        "user,meter,periodStart,used\r\n" +
        '"a,b",tokens,2026-10-01,10\r\n"say ""hi""",tokens,2026-10-01,20\r\nümlaut,tokens,2026-10-01,30\r\n' +
        "日本,tokens,2026-10-01,40\r\n",
      stderr: ""
    })
    const commands = fake.commandsReceived().slice(before)
    expect(commands).toHaveLength(partitions + 1)
    expect(commands[0]).toEqual({ op: "list_usage", meter: "tokens", periodStart: Date.UTC(2026, 9, 1) })
    expect(commands.filter((command) => command["after"] !== undefined)).toEqual([
      { op: "list_usage", meter: "tokens", periodStart: Date.UTC(2026, 9, 1), after: 'say "hi"' }
    ])
  })

  it("writes JSON lines with --format jsonl; a none meter's report sends no periodStart", async () => {
    answerList = pagesOf
    const before = fake.received.length
    const ran = await report(["storage_bytes", "-", "--format", "jsonl", "--page-size", "2"])
    expect(ran.code).toBe(0)
    expect(
      ran.stdout
        .trimEnd()
        .split("\n")
        .map((line) => JSON.parse(line) as unknown)
    ).toEqual([
      { user: "a,b", meter: "storage_bytes", periodStart: null, used: 10 },
      { user: 'say "hi"', meter: "storage_bytes", periodStart: null, used: 20 },
      { user: "ümlaut", meter: "storage_bytes", periodStart: null, used: 30 },
      { user: "日本", meter: "storage_bytes", periodStart: null, used: 40 }
    ])
    expect(fake.commandsReceived()[before]).toEqual({ op: "list_usage", meter: "storage_bytes", limit: 2 })
  })

  it("waits for a slow reader: no next page is asked for while a write is pending", async () => {
    answerList = pagesOf
    const before = fake.received.length
    let pendingWrites = 0
    const askedWhileWriting: Array<number> = []
    const stdout = async (_text: string) => {
      pendingWrites += 1
      const received = fake.received.length
      await new Promise((resolve) => setTimeout(resolve, 30))
      if (fake.received.length !== received) askedWhileWriting.push(fake.received.length - received)
      pendingWrites -= 1
    }
    const ran = await report(["tokens", "2026-10"], { stdout })
    expect(ran.code).toBe(0)
    expect(pendingWrites).toBe(0)
    expect(askedWhileWriting).toEqual([])
    expect(fake.received.length - before).toBe(partitions + 1)
  })

  it("keeps a progress line on stderr when it is a terminal, and clears it; stdout stays the same", async () => {
    answerList = pagesOf
    const quiet = await report(["tokens", "2026-10"])
    const shown = await report(["tokens", "2026-10"], { stderrIsTerminal: true })
    expect(shown.stdout).toBe(quiet.stdout)
    expect(shown.stderr).toContain(`\r\u001b[Kreport: partition 3 of ${partitions}, 2 users`)
    expect(shown.stderr.endsWith(`\r\u001b[Kreport: ${partitions} partitions, 4 users\n`)).toBe(true)
  })

  it("makes users inert when stdout is a terminal, and writes them exactly when it is not", async () => {
    answerList = (partition) =>
      partition === 0
        ? { status: "ok", usage: [{ user: "\u001b]0;owned\u0007", used: 1 }], more: false }
        : { status: "ok", usage: [], more: false }
    expect((await report(["tokens", "2026-10"])).stdout).toContain("\u001b]0;owned\u0007,tokens")
    expect((await report(["tokens", "2026-10"], { stdoutIsTerminal: true })).stdout).toContain(
      "\\u001b]0;owned\\u0007,tokens"
    )
  })

  it("exits 1 on unknown_meter, naming the meter, with nothing written to stdout", async () => {
    answerList = () => ({ status: "unknown_meter" })
    const ran = await report(["nope", "2026-10"])
    expect(ran.code).toBe(1)
    expect(ran.stdout).toBe("")
    expect(ran.stderr).toBe(
      'unknown_meter: the coordinator\'s configuration has no meter "nope" (partition 0)\n'
    )
  })

  it("exits 2 on invalid_request (a PERIOD that is not one of the meter's periods), saying why", async () => {
    answerList = () => ({
      status: "invalid_request",
      error: "periodStart: required for a meter with a period"
    })
    const ran = await report(["tokens"])
    expect(ran.code).toBe(2)
    expect(ran.stderr).toBe(
      "invalid_request: periodStart: required for a meter with a period (partition 0)\n"
    )
  })

  it("exits 2 on a usage error before connecting, and when nobody answers or NATS is away", async () => {
    const bad = await report(["tokens", "2026-13"])
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain("PERIOD must be YYYY-MM")
    expect(bad.stderr).toContain("Usage: quota-coordinator report METER [PERIOD]")
    expect((await report(["tokens", "--format", "xml"])).code).toBe(2)
    const nobody = await report(["tokens", "2026-10"], {}, { QUOTA_PREFIX: randomPrefix("nobody") })
    expect(nobody.code).toBe(2)
    expect(nobody.stderr).toMatch(/list_usage .*no_responders/)
    const away = await report(["tokens", "2026-10"], {}, { NATS_URL: "nats://127.0.0.1:1" })
    expect(away.code).toBe(2)
    expect(away.stdout).toBe("")
  })

  it("--help names the PERIOD forms, the formats and the exit codes", async () => {
    const ran = await report(["--help"])
    expect(ran.code).toBe(0)
    for (const text of [
      "YYYY-MM ",
      "YYYY-MM-DD",
      "- or none",
      "--format csv",
      "--format jsonl",
      "RFC 4180",
      "Exit codes"
    ])
      expect(ran.stdout).toContain(text)
  })
})
