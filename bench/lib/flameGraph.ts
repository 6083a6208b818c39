/**
 * A flame graph of a merged call tree (cpuProfile.ts `mergedCallTree`) as a standalone SVG: an icicle,
 * the whole busy time on top and each row one call deeper, a frame's width its inclusive time. Frames
 * narrower than `minimumFraction` of the whole are left out (they would be under 2 px), labels are cut
 * to their rectangle, and each rectangle's `<title>` (the tooltip) gives the full frame and its time.
 * Coloured by category; frames without one of their own (Node.js internals, native calls) are drawn
 * lighter in their caller's colour.
 */
import type { Category, MergedNode } from "./cpuProfile.js"
import { categories, frameLocation, frameName } from "./cpuProfile.js"
import { formatMs } from "./format.js"

export const categoryColours: Readonly<Record<Category, string>> = {
  idle: "#d9d9d9",
  gc: "#b39ddb",
  "socket writes": "#ef5350",
  transport: "#64b5f6",
  store: "#81c784",
  actors: "#ffb74d",
  domain: "#fff176",
  cluster: "#4dd0e1",
  "effect runtime": "#f06292",
  "module loading": "#a1887f",
  other: "#bdbdbd"
}

export interface FlameGraphOptions {
  readonly title: string
  readonly subtitle: string
  /** `file://` url of the repository, cut from the frames' locations. */
  readonly repositoryUrl: string
  readonly widthPx?: number
  /** Frames narrower than this fraction of the whole are not drawn. */
  readonly minimumFraction?: number
}

const defaultWidthPx = 1600
const defaultMinimumFraction = 0.001
const marginPx = 10
const rowHeightPx = 16
const chartTopPx = 104
const labelFontPx = 11
/** Width of one character of an 11 px monospace font, rounded up so a label never overflows. */
const labelCharacterPx = 7
const labelPaddingPx = 3
/** Fewer characters than this and a label says nothing: left out. */
const labelCharactersMin = 3
const legendSwatchPx = 12
const legendEntryPx = 150
/** How far an inherited frame's colour is mixed towards white. */
const inheritedLightening = 0.55

const escapeXml = (text: string): string =>
  text.replace(
    /[&<>"']/g,
    (character) =>
      ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&apos;" })[character] ?? character
  )

const lighten = (hex: string, amount: number): string => {
  const channels = [1, 3, 5].map((start) => parseInt(hex.slice(start, start + 2), 16))
  return `#${channels
    .map((channel) =>
      Math.round(channel + (255 - channel) * amount)
        .toString(16)
        .padStart(2, "0")
    )
    .join("")}`
}

/** The label cut to `characters`, with an ellipsis when something was cut. */
const clipLabel = (label: string, characters: number): string =>
  label.length <= characters ? label : `${label.slice(0, Math.max(0, characters - 1))}…`

/** The file a location names, without its folders and position: what fits in a label. */
const shortFile = (location: string): string => {
  const file = location.replace(/:-?\d+:-?\d+$/, "")
  return file.slice(file.lastIndexOf("/") + 1).replace(/^node:/, "")
}

const microsPerMs = 1000
const formatMicros = (micros: number): string => formatMs(micros / microsPerMs)

export const renderFlameGraph = (root: MergedNode, options: FlameGraphOptions): string => {
  const widthPx = options.widthPx ?? defaultWidthPx
  const minimumFraction = options.minimumFraction ?? defaultMinimumFraction
  const chartWidthPx = widthPx - 2 * marginPx
  const total = Math.max(1, root.totalMicros)
  const rectangles: Array<string> = []
  let deepest = 0

  const draw = (node: MergedNode, depth: number, xPx: number, isRoot: boolean) => {
    const nodeWidthPx = (node.totalMicros / total) * chartWidthPx
    const yPx = chartTopPx + depth * rowHeightPx
    deepest = Math.max(deepest, depth)
    const name = frameName(node.frame)
    const location = isRoot ? "" : frameLocation(node.frame, options.repositoryUrl)
    const percent = ((100 * node.totalMicros) / total).toFixed(2)
    const categoryText = isRoot ? "" : ` · ${node.category}${node.inherited ? " (caller's category)" : ""}`
    const tooltip = `${name}${location === "" ? "" : ` ${location}`}${categoryText} · ${formatMicros(node.totalMicros)} ms, ${percent}% of busy time (self ${formatMicros(node.selfMicros)} ms)`
    const colour = isRoot
      ? "#eeeeee"
      : node.inherited
        ? lighten(categoryColours[node.category], inheritedLightening)
        : categoryColours[node.category]
    const characters = Math.floor((nodeWidthPx - 2 * labelPaddingPx) / labelCharacterPx)
    const label = isRoot ? `${name} ${formatMicros(node.totalMicros)} ms` : `${name} ${shortFile(location)}`
    const text =
      characters >= labelCharactersMin
        ? `<text x="${(xPx + labelPaddingPx).toFixed(1)}" y="${yPx + rowHeightPx - 4}">${escapeXml(clipLabel(label, characters))}</text>`
        : ""
    rectangles.push(
      `<g><title>${escapeXml(tooltip)}</title><rect x="${xPx.toFixed(1)}" y="${yPx}" width="${nodeWidthPx.toFixed(1)}" height="${rowHeightPx - 1}" fill="${colour}"/>${text}</g>`
    )
    let childXPx = xPx
    const children = [...node.children.values()].sort((left, right) => right.totalMicros - left.totalMicros)
    for (const child of children) {
      if (child.totalMicros / total < minimumFraction) continue
      draw(child, depth + 1, childXPx, false)
      childXPx += (child.totalMicros / total) * chartWidthPx
    }
  }
  draw(root, 0, marginPx, true)

  const legend = categories
    .filter((category) => category !== "idle")
    .map((category, index) => {
      const xPx = marginPx + index * legendEntryPx
      return `<rect x="${xPx}" y="62" width="${legendSwatchPx}" height="${legendSwatchPx}" fill="${categoryColours[category]}"/><text x="${xPx + legendSwatchPx + 4}" y="72">${escapeXml(category)}</text>`
    })
  const heightPx = chartTopPx + (deepest + 1) * rowHeightPx + marginPx
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${widthPx}" height="${heightPx}" viewBox="0 0 ${widthPx} ${heightPx}" font-family="sans-serif" font-size="12">`,
    `<style>g text { font-family: monospace; font-size: ${labelFontPx}px; pointer-events: none; } g:hover rect { stroke: #000; stroke-width: 1; }</style>`,
    `<rect x="0" y="0" width="${widthPx}" height="${heightPx}" fill="#ffffff"/>`,
    `<text x="${marginPx}" y="24" font-size="16" font-weight="bold">${escapeXml(options.title)}</text>`,
    `<text x="${marginPx}" y="44">${escapeXml(options.subtitle)}</text>`,
    ...legend,
    `<text x="${marginPx}" y="92" fill="#555555">Width: inclusive time. Lighter: Node.js internal or native frames, counted for their caller's category. Hover for the frame, its file:line:column (of tsx's output for .ts files) and its time; frames under ${(minimumFraction * 100).toFixed(1)}% are left out.</text>`,
    ...rectangles,
    "</svg>",
    ""
  ].join("\n")
}
