/**
 * bench/lib/cpuProfile.ts and flameGraph.ts on a hand-made profile: which category each sample counts
 * for (its own frame's, else its nearest caller's), the merged call tree, and the SVG drawn from it.
 */
import { describe, expect, it } from "vitest"
import type { CallFrame, CpuProfile } from "../../bench/lib/cpuProfile.js"
import { frameCategory, mergedCallTree, packageOf, summarizeProfile } from "../../bench/lib/cpuProfile.js"
import { renderFlameGraph } from "../../bench/lib/flameGraph.js"

const repositoryUrl = "file:///repo"
const frame = (functionName: string, url: string, lineNumber = 0, columnNumber = 0): CallFrame => ({
  functionName,
  url,
  lineNumber,
  columnNumber
})
const native = (functionName: string) => frame(functionName, "", -1, -1)

/** Every sample lasts 1 ms: sample i at i ms, the profile ending 1 ms after the last. */
const sampleMicros = 1000
const profileOf = (nodes: CpuProfile["nodes"], samples: ReadonlyArray<number>): CpuProfile => ({
  nodes,
  startTime: 0,
  endTime: samples.length * sampleMicros,
  samples,
  timeDeltas: samples.map((_, index) => (index === 0 ? 0 : sampleMicros))
})

const decide = frame("<decide>", `${repositoryUrl}/src/domain/decide.ts`, 0, 120)
const profile = profileOf(
  [
    { id: 1, callFrame: native("(root)"), children: [2, 3, 4, 5, 9] },
    { id: 2, callFrame: native("(program)") },
    { id: 3, callFrame: native("(idle)") },
    { id: 4, callFrame: native("(garbage collector)") },
    { id: 5, callFrame: frame("run", `${repositoryUrl}/src/actors/UserActor.ts`), children: [6, 7, 12] },
    {
      id: 6,
      callFrame: frame("runLoop", `${repositoryUrl}/node_modules/effect/dist/internal/effect.js`, 452, 9),
      children: [8]
    },
    { id: 7, callFrame: decide },
    { id: 8, callFrame: frame("writevGeneric", "node:internal/stream_base_commons"), children: [10] },
    { id: 9, callFrame: frame("query", `${repositoryUrl}/node_modules/pg/lib/client.js`), children: [11] },
    { id: 10, callFrame: native("writev") },
    { id: 11, callFrame: frame("", "node:net") },
    // The same frame as node 7 under the same caller: one frame in the merged tree.
    { id: 12, callFrame: decide }
  ],
  [3, 3, 2, 4, 5, 6, 8, 10, 10, 7, 12, 9, 11, 11]
)

const msOf = (summary: ReturnType<typeof summarizeProfile>) =>
  Object.fromEntries(summary.byCategory.map((entry) => [entry.category, entry.ms]))

describe("frameCategory", () => {
  it("knows a frame by its file or package, and socket writes by their caller", () => {
    expect(frameCategory(frame("x", `${repositoryUrl}/src/transport/decode.ts`))).toBe("transport")
    expect(frameCategory(frame("x", `${repositoryUrl}/node_modules/@nats-io/nats-core/lib/parser.js`))).toBe(
      "transport"
    )
    expect(frameCategory(frame("x", `${repositoryUrl}/node_modules/pg-protocol/dist/parser.js`))).toBe(
      "store"
    )
    expect(frameCategory(frame("x", "node:internal/modules/esm/loader"))).toBe("module loading")
    // A package's own src/store is not the coordinator's.
    expect(frameCategory(frame("x", `${repositoryUrl}/node_modules/other/src/store/a.js`))).toBeUndefined()
    expect(
      frameCategory(native("writeBuffer"), frame("handleWriteReq", "node:internal/stream_base_commons"))
    ).toBe("socket writes")
    expect(frameCategory(native("writeBuffer"), frame("writeSync", "node:fs"))).toBeUndefined()
    expect(packageOf(`${repositoryUrl}/node_modules/@nats-io/nats-core/lib/parser.js`)).toBe(
      "@nats-io/nats-core"
    )
  })
})

describe("summarizeProfile", () => {
  it("counts each sample for its nearest frame with a category", () => {
    const summary = summarizeProfile(profile, { repositoryUrl, topCount: 3 })
    expect(msOf(summary)).toEqual({
      idle: 2,
      gc: 1,
      "socket writes": 2,
      transport: 0,
      store: 3,
      actors: 1,
      domain: 2,
      cluster: 0,
      "effect runtime": 2,
      "module loading": 0,
      other: 1
    })
    expect(summary.busyMs).toBe(12)
    expect(summary.programMs).toBe(1)
    expect(summary.sampleCount).toBe(14)
    expect(summary.byCategory.find((entry) => entry.category === "store")?.percentOfBusy).toBe(25)
    // The two nodes of the same frame are one function; ties keep the order first seen.
    expect(summary.topFunctions.map((entry) => [entry.name, entry.location, entry.ms])).toEqual([
      ["writev", "(native)", 2],
      ["<decide>", "src/domain/decide.ts:0:120", 2],
      ["(anonymous)", "node:net:0:0", 2]
    ])
  })

  it("keeps to the samples inside a window", () => {
    const summary = summarizeProfile(profile, {
      repositoryUrl,
      topCount: 3,
      window: { fromMicros: 0, toMicros: 3 * sampleMicros }
    })
    expect(summary.sampleCount).toBe(3)
    expect(summary.idleMs).toBe(2)
    expect(summary.busyMs).toBe(1)
    expect(summary.spanMs).toBe(3)
  })
})

describe("mergedCallTree", () => {
  it("merges a caller's children that are the same frame and leaves idle and (program) out", () => {
    const root = mergedCallTree(profile)
    expect(root.totalMicros).toBe(11 * sampleMicros)
    const names = (node: typeof root) => [...node.children.values()].map((child) => child.frame.functionName)
    expect(names(root)).toEqual(["(garbage collector)", "run", "query"])
    const run = [...root.children.values()].find((child) => child.frame.functionName === "run")!
    expect(run.totalMicros).toBe(7 * sampleMicros)
    expect(run.selfMicros).toBe(sampleMicros)
    const merged = [...run.children.values()].filter((child) => child.frame.functionName === "<decide>")
    expect(merged).toHaveLength(1)
    expect(merged[0]?.totalMicros).toBe(2 * sampleMicros)
    const writevGeneric = [...run.children.values()][0]?.children.values().next().value
    expect(writevGeneric?.category).toBe("effect runtime")
    expect(writevGeneric?.inherited).toBe(true)
  })
})

describe("renderFlameGraph", () => {
  it("draws a titled rectangle per frame wide enough, names escaped", () => {
    const svg = renderFlameGraph(mergedCallTree(profile), { title: "t", subtitle: "s", repositoryUrl })
    expect(svg.startsWith("<svg")).toBe(true)
    expect(svg).toContain("&lt;decide&gt; src/domain/decide.ts:0:120 · domain · 2.00 ms, 18.18% of busy time")
    expect(svg).not.toContain("<decide>")
    // 9 frames: the root, gc, run, runLoop, writevGeneric, writev, decide, query, node:net.
    expect(svg.match(/<title>/g)).toHaveLength(9)
    const narrow = renderFlameGraph(mergedCallTree(profile), {
      title: "t",
      subtitle: "s",
      repositoryUrl,
      minimumFraction: 0.1
    })
    // gc, 1 ms, is under a tenth of the 11 ms: left out.
    expect(narrow).not.toContain("garbage collector")
    expect(narrow.match(/<title>/g)).toHaveLength(8)
  })
})
