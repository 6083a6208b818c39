/**
 * Reads a V8 `.cpuprofile` (what `node --cpu-prof` writes) and says where the time went: self time by
 * category, the functions with the most self time, and the call tree merged by frame for the flame
 * graph (flameGraph.ts). Pure apart from `readCpuProfile`.
 *
 * A sample counts for the category of its nearest frame, itself or a caller, that has one: a Node.js
 * internal frame (`node:net`, a native call) called from pg counts for `store`, Effect's runtime called
 * from an actor counts for `effect runtime`. Sample i lasts until sample i + 1 (the last until the
 * profile's end), as Chrome's DevTools count it.
 */
import { readFile } from "node:fs/promises"

export interface CallFrame {
  readonly functionName: string
  readonly url: string
  /** 0-based, as V8 gives it. */
  readonly lineNumber: number
  /** 0-based, as V8 gives it. */
  readonly columnNumber: number
}

export interface ProfileNode {
  readonly id: number
  readonly callFrame: CallFrame
  readonly children?: ReadonlyArray<number>
}

export interface CpuProfile {
  readonly nodes: ReadonlyArray<ProfileNode>
  /** Microseconds, the platform's monotonic clock (the one `process.hrtime` reads). */
  readonly startTime: number
  readonly endTime: number
  /** The node id on top of the stack at each sample. */
  readonly samples: ReadonlyArray<number>
  /** Microseconds since the previous sample (the first: since `startTime`). */
  readonly timeDeltas: ReadonlyArray<number>
}

export const categories = [
  "idle",
  "gc",
  "socket writes",
  "transport",
  "store",
  "actors",
  "domain",
  "cluster",
  "effect runtime",
  "module loading",
  "other"
] as const
export type Category = (typeof categories)[number]

/** Samples taken in this span only (profile microseconds); the whole profile when absent. */
export interface TimeWindow {
  readonly fromMicros: number
  readonly toMicros: number
}

/** The native calls that hand bytes to a socket (StreamBase), from Node's stream_base_commons. */
const socketWriteNames = new Set([
  "writev",
  "writeBuffer",
  "writeUtf8String",
  "writeLatin1String",
  "writeAsciiString",
  "writeUcs2String"
])
const socketWriteCaller = "node:internal/stream_base_commons"
const sourceCategories: ReadonlyArray<readonly [RegExp, Category]> = [
  [/(^|\/)src\/transport\//, "transport"],
  [/(^|\/)src\/store\//, "store"],
  [/(^|\/)src\/actors\//, "actors"],
  [/(^|\/)src\/domain\//, "domain"],
  [/(^|\/)src\/cluster\//, "cluster"]
]
const packageCategories: ReadonlyArray<readonly [RegExp, Category]> = [
  [/^@nats-io\//, "transport"],
  // pg and its own packages (pg-protocol, pg-pool, pg-types, …).
  [/^pg(-[a-z-]+)?$/, "store"],
  [/^effect$/, "effect runtime"],
  [/^tsx$/, "module loading"]
]
// Node's module loaders and its builtin-module compiler: startup, and the odd lazy require.
const moduleLoadingPrefixes = ["node:internal/modules/", "node:internal/bootstrap/realm"]

const nodeModulesMarker = "/node_modules/"

/** The package a url is in (`effect`, `@nats-io/nats-core`), undefined outside node_modules. */
export const packageOf = (url: string): string | undefined => {
  const at = url.lastIndexOf(nodeModulesMarker)
  if (at < 0) return undefined
  const parts = url.slice(at + nodeModulesMarker.length).split("/")
  return parts[0]?.startsWith("@") === true ? `${parts[0]}/${parts[1] ?? ""}` : parts[0]
}

/** The frame's own category; undefined when it has none and counts for its caller's. */
export const frameCategory = (frame: CallFrame, caller?: CallFrame): Category | undefined => {
  const { functionName, url } = frame
  if (url === "") {
    if (functionName === "(idle)") return "idle"
    if (functionName === "(garbage collector)") return "gc"
    if (socketWriteNames.has(functionName) && caller?.url === socketWriteCaller) return "socket writes"
    return undefined
  }
  const packageName = packageOf(url)
  if (packageName !== undefined) {
    return packageCategories.find(([pattern]) => pattern.test(packageName))?.[1]
  }
  if (moduleLoadingPrefixes.some((prefix) => url.startsWith(prefix))) return "module loading"
  return sourceCategories.find(([pattern]) => pattern.test(url))?.[1]
}

/** Where native frames (no script: the collector, C++ bindings) are. */
export const nativeLocation = "(native)"

/** Where a frame is: the file relative to the repository or from its package's name on, `(native)`. */
export const frameLocation = (frame: CallFrame, repositoryUrl: string): string => {
  const { url } = frame
  if (url === "") return nativeLocation
  const at = url.lastIndexOf(nodeModulesMarker)
  const file =
    at >= 0
      ? url.slice(at + nodeModulesMarker.length)
      : url.startsWith(repositoryUrl)
        ? url.slice(repositoryUrl.length).replace(/^\//, "")
        : url
  return `${file}:${frame.lineNumber}:${frame.columnNumber}`
}

export const frameName = (frame: CallFrame): string => frame.functionName || "(anonymous)"

/** Frames that are the same function at the same place are one frame in the merged tree. */
export const frameKey = (frame: CallFrame): string =>
  `${frame.functionName}\u0000${frame.url}\u0000${frame.lineNumber}\u0000${frame.columnNumber}`

export const readCpuProfile = async (path: string): Promise<CpuProfile> =>
  JSON.parse(await readFile(path, "utf8")) as CpuProfile

/** Each node's parent, its own category, and the category its samples count for. */
interface Indexed {
  readonly byId: ReadonlyMap<number, ProfileNode>
  readonly parentOf: ReadonlyMap<number, number>
  readonly ownCategory: (id: number) => Category | undefined
  readonly countedCategory: (id: number) => Category
  readonly rootId: number
}

const indexProfile = (profile: CpuProfile): Indexed => {
  const byId = new Map(profile.nodes.map((node) => [node.id, node]))
  const parentOf = new Map<number, number>()
  for (const node of profile.nodes) for (const child of node.children ?? []) parentOf.set(child, node.id)
  const rootId = profile.nodes.find((node) => !parentOf.has(node.id))?.id ?? -1
  const ownCategory = (id: number): Category | undefined => {
    const node = byId.get(id)
    if (node === undefined) return undefined
    const parentId = parentOf.get(id)
    return frameCategory(node.callFrame, parentId === undefined ? undefined : byId.get(parentId)?.callFrame)
  }
  const counted = new Map<number, Category>()
  const countedCategory = (id: number): Category => {
    const known = counted.get(id)
    if (known !== undefined) return known
    // Walk up to the nearest frame with a category, then remember it for every node passed.
    const path: Array<number> = []
    let current: number | undefined = id
    let found: Category = "other"
    while (current !== undefined) {
      const cached = counted.get(current)
      if (cached !== undefined) {
        found = cached
        break
      }
      path.push(current)
      const own = ownCategory(current)
      if (own !== undefined) {
        found = own
        break
      }
      current = parentOf.get(current)
    }
    for (const passed of path) counted.set(passed, found)
    return found
  }
  return { byId, parentOf, ownCategory, countedCategory, rootId }
}

/** Self time per node id in microseconds, of the samples inside `window`, and how many samples that is. */
export const selfTimes = (
  profile: CpuProfile,
  window?: TimeWindow
): { readonly micros: Map<number, number>; readonly sampleCount: number } => {
  const micros = new Map<number, number>()
  let sampleCount = 0
  let timestamp = profile.startTime
  const timestamps = profile.timeDeltas.map((delta) => (timestamp += delta))
  profile.samples.forEach((id, index) => {
    const at = timestamps[index] ?? profile.endTime
    if (window !== undefined && (at < window.fromMicros || at >= window.toMicros)) return
    // V8 now and then writes a sample out of order: a negative duration counts as none.
    const duration = Math.max(0, (timestamps[index + 1] ?? profile.endTime) - at)
    micros.set(id, (micros.get(id) ?? 0) + duration)
    sampleCount += 1
  })
  return { micros, sampleCount }
}

export interface CategoryTime {
  readonly category: Category
  readonly ms: number
  /** Of the non-idle time; undefined for `idle` itself. */
  readonly percentOfBusy: number | undefined
}

export interface FunctionTime {
  readonly name: string
  readonly location: string
  readonly category: Category
  readonly ms: number
  readonly percentOfBusy: number
}

export interface ProfileSummary {
  /** The span the samples cover (the window, or the whole profile). */
  readonly spanMs: number
  readonly sampleCount: number
  readonly idleMs: number
  /** Everything but idle. */
  readonly busyMs: number
  /** `(program)`: native time V8 attributes to no JavaScript function; counted in `other`. */
  readonly programMs: number
  readonly byCategory: ReadonlyArray<CategoryTime>
  /** By self time, most first; idle left out. */
  readonly topFunctions: ReadonlyArray<FunctionTime>
}

const microsPerMs = 1000
const percentOf = (part: number, whole: number) => (whole > 0 ? (100 * part) / whole : 0)

export const summarizeProfile = (
  profile: CpuProfile,
  options: { readonly repositoryUrl: string; readonly window?: TimeWindow; readonly topCount: number }
): ProfileSummary => {
  const indexed = indexProfile(profile)
  const { micros: times, sampleCount } = selfTimes(profile, options.window)
  const categoryMicros = new Map<Category, number>(categories.map((category) => [category, 0]))
  const functionMicros = new Map<string, { frame: CallFrame; category: Category; micros: number }>()
  let programMicros = 0
  for (const [id, micros] of times) {
    const node = indexed.byId.get(id)
    if (node === undefined) continue
    const category = indexed.countedCategory(id)
    categoryMicros.set(category, (categoryMicros.get(category) ?? 0) + micros)
    if (node.callFrame.functionName === "(program)" && node.callFrame.url === "") programMicros += micros
    if (category === "idle") continue
    const key = frameKey(node.callFrame)
    const entry = functionMicros.get(key) ?? { frame: node.callFrame, category, micros: 0 }
    entry.micros += micros
    functionMicros.set(key, entry)
  }
  const idleMicros = categoryMicros.get("idle") ?? 0
  const totalMicros = [...categoryMicros.values()].reduce((sum, micros) => sum + micros, 0)
  const busyMicros = totalMicros - idleMicros
  const spanMicros =
    options.window === undefined
      ? profile.endTime - profile.startTime
      : Math.min(options.window.toMicros, profile.endTime) -
        Math.max(options.window.fromMicros, profile.startTime)
  return {
    spanMs: Math.max(0, spanMicros) / microsPerMs,
    sampleCount,
    idleMs: idleMicros / microsPerMs,
    busyMs: busyMicros / microsPerMs,
    programMs: programMicros / microsPerMs,
    byCategory: categories.map((category) => {
      const micros = categoryMicros.get(category) ?? 0
      return {
        category,
        ms: micros / microsPerMs,
        percentOfBusy: category === "idle" ? undefined : percentOf(micros, busyMicros)
      }
    }),
    topFunctions: [...functionMicros.values()]
      .sort((left, right) => right.micros - left.micros)
      .slice(0, options.topCount)
      .map(({ frame, category, micros }) => ({
        name: frameName(frame),
        location: frameLocation(frame, options.repositoryUrl),
        category,
        ms: micros / microsPerMs,
        percentOfBusy: percentOf(micros, busyMicros)
      }))
  }
}

export interface MergedNode {
  readonly frame: CallFrame
  /** The frame's own category, or the nearest caller's when it has none (`inherited`). */
  readonly category: Category
  readonly inherited: boolean
  /** Microseconds in this frame and everything it called. */
  totalMicros: number
  selfMicros: number
  readonly children: Map<string, MergedNode>
}

/** Roots that are not the process at work: left out of the merged tree, so its width is busy time. */
const notBusyRoots = new Set(["(idle)", "(program)"])

/**
 * The call tree with the children that are the same frame merged, each node's total (inclusive) time
 * of the samples inside `window`. The returned root stands for the whole busy time.
 */
export const mergedCallTree = (profile: CpuProfile, window?: TimeWindow): MergedNode => {
  const indexed = indexProfile(profile)
  const times = selfTimes(profile, window).micros
  const root: MergedNode = {
    frame: { functionName: "all busy time", url: "", lineNumber: -1, columnNumber: -1 },
    category: "other",
    inherited: false,
    totalMicros: 0,
    selfMicros: 0,
    children: new Map()
  }
  const visit = (id: number, into: MergedNode): number => {
    const node = indexed.byId.get(id)
    if (node === undefined) return 0
    const own = indexed.ownCategory(id)
    const key = frameKey(node.callFrame)
    const merged = into.children.get(key) ?? {
      frame: node.callFrame,
      category: own ?? indexed.countedCategory(id),
      inherited: own === undefined,
      totalMicros: 0,
      selfMicros: 0,
      children: new Map<string, MergedNode>()
    }
    into.children.set(key, merged)
    const self = times.get(id) ?? 0
    let total = self
    for (const child of node.children ?? []) total += visit(child, merged)
    merged.selfMicros += self
    merged.totalMicros += total
    if (merged.totalMicros === 0) into.children.delete(key)
    return total
  }
  const profileRoot = indexed.byId.get(indexed.rootId)
  for (const child of profileRoot?.children ?? []) {
    const frame = indexed.byId.get(child)?.callFrame
    if (frame !== undefined && frame.url === "" && notBusyRoots.has(frame.functionName)) continue
    root.totalMicros += visit(child, root)
  }
  return root
}
