/**
 * The monitoring examples name only metrics the service exports: every PromQL expression of the
 * Grafana dashboard (deploy/grafana/dashboards) and of the Prometheus alerts (deploy/prometheus) is
 * read, the metric names it references are extracted, and each must be one the real registry
 * (src/ops/PrometheusMetrics.ts) serves on GET /metrics. A renamed metric, or a typo in a panel,
 * fails here instead of showing as an empty panel or an alert that can never fire.
 */
import { readFileSync } from "node:fs"
import { beforeAll, describe, expect, it } from "vitest"
import { makePrometheusMetrics } from "../../src/ops/PrometheusMetrics.js"

const repoFile = (path: string): string => readFileSync(new URL(`../../${path}`, import.meta.url), "utf8")

/** PromQL's functions and aggregation operators, and Grafana's template-variable query functions. */
const knownFunctions = new Set([
  ...["sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk"],
  ...["quantile", "limitk", "limit_ratio"],
  ...["abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil"],
  ...["avg_over_time", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time"],
  ...["days_in_month", "day_of_month", "day_of_week", "day_of_year", "deg", "delta", "deriv", "exp"],
  ...["floor", "histogram_avg", "histogram_count", "histogram_fraction", "histogram_quantile"],
  ...["histogram_stddev", "histogram_stdvar", "histogram_sum", "double_exponential_smoothing"],
  ...["holt_winters", "hour", "idelta", "increase", "info", "irate", "label_join", "label_replace"],
  ...["last_over_time", "ln", "log10", "log2", "mad_over_time", "max_over_time", "min_over_time"],
  ...["minute", "month", "pi", "predict_linear", "present_over_time", "quantile_over_time", "rad"],
  ...["rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_by_label"],
  ...["sort_by_label_desc", "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time"],
  ...["sum_over_time", "tan", "tanh", "time", "timestamp", "vector", "year", "start", "end"],
  ...["label_values", "label_names", "metrics", "query_result"]
])

/** Keywords followed by a list of label names: the list is skipped. */
const labelListKeywords = new Set(["by", "without", "on", "ignoring", "group_left", "group_right"])
/** Binary operators and literals spelled as words. */
const wordKeywords = new Set(["and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"])

/** Series Prometheus writes itself for every scrape target. */
const prometheusSeries = ["up"]

interface PromqlReferences {
  readonly metrics: ReadonlyArray<string>
  readonly functions: ReadonlyArray<string>
}

/** Index just past the string literal opening at `start` ("", '' or ``, with backslash escapes). */
const skipString = (text: string, start: number): number => {
  const quote = text[start]
  let index = start + 1
  while (index < text.length && text[index] !== quote) index += text[index] === "\\" ? 2 : 1
  return index + 1
}

/** Index just past the bracket closing the one at `start`, strings inside skipped. */
const skipBracketed = (text: string, start: number): number => {
  const open = text[start]!
  const close = { "{": "}", "[": "]", "(": ")" }[open]
  let depth = 0
  let index = start
  while (index < text.length) {
    const char = text[index]!
    if (char === '"' || char === "'" || char === "`") {
      index = skipString(text, index)
      continue
    }
    if (char === open) depth += 1
    else if (char === close && --depth === 0) return index + 1
    index += 1
  }
  return index
}

/** Splits `text` at its top-level commas (not inside brackets or strings). */
const splitArguments = (text: string): Array<string> => {
  const parts: Array<string> = []
  let from = 0
  let index = 0
  while (index < text.length) {
    const char = text[index]!
    if (char === '"' || char === "'" || char === "`") index = skipString(text, index)
    else if (char === "{" || char === "[" || char === "(") index = skipBracketed(text, index)
    else {
      if (char === ",") {
        parts.push(text.slice(from, index))
        from = index + 1
      }
      index += 1
    }
  }
  parts.push(text.slice(from))
  return parts
}

/**
 * The metric names and functions a PromQL expression (or a Grafana `label_values(...)` query)
 * references. Skipped: string literals, label matchers in braces (apart from a `__name__` matcher),
 * ranges and subqueries in brackets, `by (...)`-style label lists, numbers and durations, Grafana
 * variables (`$instance`, `${DS}`, `$__rate_interval`) and comments.
 */
const promqlReferences = (expr: string): PromqlReferences => {
  const metrics = new Set<string>()
  const functions = new Set<string>()
  let index = 0
  while (index < expr.length) {
    const char = expr[index]!
    if (/\s/.test(char)) index += 1
    else if (char === "#") {
      const end = expr.indexOf("\n", index)
      index = end < 0 ? expr.length : end
    } else if (char === '"' || char === "'" || char === "`") index = skipString(expr, index)
    else if (char === "{") {
      const end = skipBracketed(expr, index)
      const byName = /__name__\s*=\s*"([^"]+)"/.exec(expr.slice(index, end))
      if (byName) metrics.add(byName[1]!)
      index = end
    } else if (char === "[") index = skipBracketed(expr, index)
    else if (char === "$") {
      index += 1
      if (expr[index] === "{") index = skipBracketed(expr, index)
      else while (index < expr.length && /[A-Za-z0-9_]/.test(expr[index]!)) index += 1
    } else if (/[0-9.]/.test(char)) {
      while (index < expr.length && /[A-Za-z0-9_.]/.test(expr[index]!)) index += 1
    } else if (/[A-Za-z_:]/.test(char)) {
      const word = /^[A-Za-z_:][A-Za-z0-9_:]*/.exec(expr.slice(index))![0]
      const end = index + word.length
      let next = end
      while (next < expr.length && /\s/.test(expr[next]!)) next += 1
      if (labelListKeywords.has(word)) index = expr[next] === "(" ? skipBracketed(expr, next) : end
      else if (wordKeywords.has(word)) index = end
      // An aggregation: `sum (...)`, or `sum by (...) (...)` with its label list first.
      else if (expr[next] === "(" || /^(by|without)\s*\(/.test(expr.slice(next))) {
        functions.add(word)
        if (word === "label_values") {
          // label_values(selector, label): the last argument is a label name, not a metric.
          const close = skipBracketed(expr, next)
          const args = splitArguments(expr.slice(next + 1, close - 1))
          if (args.length > 1) {
            const inner = promqlReferences(args.slice(0, -1).join(","))
            inner.metrics.forEach((metric) => metrics.add(metric))
            inner.functions.forEach((fn) => functions.add(fn))
          }
          index = close
        } else index = end
      } else {
        metrics.add(word)
        index = end
      }
    } else index += 1
  }
  return { metrics: [...metrics], functions: [...functions] }
}

/** The metrics of `expr` not in `exported`. */
const unknownMetrics = (expr: string, exported: ReadonlySet<string>): Array<string> =>
  promqlReferences(expr).metrics.filter((metric) => !exported.has(metric))

/** Names of the `# TYPE` lines, with a histogram's `_bucket`, `_sum`, `_count` and a summary's. */
const exportedNames = (exposition: string): Set<string> => {
  const names = new Set<string>()
  for (const [, name, type] of exposition.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    names.add(name!)
    if (type === "histogram") for (const suffix of ["_bucket", "_sum", "_count"]) names.add(name! + suffix)
    if (type === "summary") for (const suffix of ["_sum", "_count"]) names.add(name! + suffix)
  }
  return names
}

/** Names that have at least one sample line in the exposition. */
const sampledNames = (exposition: string): Set<string> =>
  new Set(
    exposition
      .split("\n")
      .filter((line) => line !== "" && !line.startsWith("#"))
      .map((line) => /^[A-Za-z_:][A-Za-z0-9_:]*/.exec(line)![0])
  )

/**
 * The `expr:` values of a Prometheus rule file, without a YAML parser: plain and quoted scalars on
 * the key's line (plain ones may continue on more-indented lines), and `|` / `>` block scalars.
 */
const ruleExpressions = (yaml: string): Array<string> => {
  const lines = yaml.split(/\r?\n/)
  const expressions: Array<string> = []
  for (let index = 0; index < lines.length; index += 1) {
    const match = /^(\s*(?:-\s+)?)expr:\s*(.*)$/.exec(lines[index]!)
    if (!match) continue
    const keyIndent = match[1]!.length
    const value = match[2]!.trim()
    // Lines indented deeper than the key belong to its value.
    const continuation: Array<string> = []
    let next = index + 1
    for (; next < lines.length; next += 1) {
      const line = lines[next]!
      if (line.trim() === "") continue
      if (line.length - line.trimStart().length <= keyIndent) break
      continuation.push(line)
    }
    index = next - 1
    // A block scalar keeps its lines, less the indentation of its first line.
    const blockIndent = (continuation[0] ?? "").length - (continuation[0] ?? "").trimStart().length
    if (/^[|>][+-]?\d*\s*(#.*)?$/.test(value))
      expressions.push(continuation.map((line) => line.slice(blockIndent).trimEnd()).join("\n"))
    else if (value.startsWith('"'))
      expressions.push(JSON.parse(/^"(?:[^"\\]|\\.)*"/.exec(value)![0]) as string)
    else if (value.startsWith("'"))
      expressions.push(/^'((?:[^']|'')*)'/.exec(value)![1]!.replaceAll("''", "'"))
    else
      expressions.push([value.replace(/\s+#.*$/, ""), ...continuation.map((line) => line.trim())].join(" "))
  }
  return expressions
}

interface Target {
  readonly expr?: string
  readonly datasource?: { readonly uid?: string }
}
interface Panel {
  readonly type: string
  readonly title: string
  readonly datasource?: { readonly uid?: string }
  readonly targets?: ReadonlyArray<Target>
  readonly panels?: ReadonlyArray<Panel>
}
interface Variable {
  readonly name: string
  readonly type: string
  readonly query?: string | { readonly query?: string }
  readonly definition?: string
}
interface Dashboard {
  readonly panels: ReadonlyArray<Panel>
  readonly templating: { readonly list: ReadonlyArray<Variable> }
}

/** Every panel, those inside (collapsed) rows too. */
const allPanels = (panels: ReadonlyArray<Panel>): Array<Panel> =>
  panels.flatMap((panel) => [panel, ...allPanels(panel.panels ?? [])])

/** How many `expr` keys the JSON holds anywhere: what the panel walk must find. */
const countExprKeys = (value: unknown): number =>
  Array.isArray(value)
    ? value.reduce((total: number, item) => total + countExprKeys(item), 0)
    : typeof value === "object" && value !== null
      ? Object.entries(value).reduce(
          (total, [key, item]) => total + (key === "expr" ? 1 : 0) + countExprKeys(item),
          0
        )
      : 0

describe("monitoring examples reference only exported metrics", () => {
  let exported: Set<string>
  let sampled: Set<string>
  const dashboard = JSON.parse(repoFile("deploy/grafana/dashboards/quota-coordinator.json")) as Dashboard
  const panels = allPanels(dashboard.panels)
  const panelExpressions = panels.flatMap((panel) =>
    (panel.targets ?? []).flatMap((target) => (target.expr === undefined ? [] : [target.expr]))
  )
  const variableExpressions = dashboard.templating.list
    .filter((variable) => variable.type === "query")
    .flatMap((variable) => [
      typeof variable.query === "string" ? variable.query : (variable.query?.query ?? ""),
      variable.definition ?? ""
    ])
    .filter((query) => query !== "")
  const dashboardExpressions = [...panelExpressions, ...variableExpressions]
  const alertsYaml = repoFile("deploy/prometheus/alerts.yml")
  const alertExpressions = ruleExpressions(alertsYaml)

  beforeAll(async () => {
    const metrics = makePrometheusMetrics({ meters: ["tokens"], plans: ["free"] })
    // One observation of each kind, so that the labelled series and the histograms' buckets exist.
    metrics.recorder.commandAnswered("reserve", "reserved", 0.001)
    metrics.recorder.storeCommitted(0.002, true)
    metrics.recorder.writeFenced()
    metrics.recorder.holdExpired("tokens")
    metrics.recorder.slotBusy("free")
    const { body } = await metrics.scrape()
    exported = new Set([...exportedNames(body), ...prometheusSeries])
    sampled = new Set([...sampledNames(body), ...prometheusSeries])
  })

  it("extracts metric names, not functions, keywords, labels or variables", () => {
    expect(
      promqlReferences(
        'histogram_quantile(0.99, sum by (le, op) (rate(quota_command_duration_seconds_bucket{instance=~"$instance", op!="x"}[$__rate_interval])))'
      )
    ).toEqual({
      metrics: ["quota_command_duration_seconds_bucket"],
      functions: ["histogram_quantile", "sum", "rate"]
    })
    expect(
      promqlReferences(
        "sum(rate(a_total[5m] offset 1h)) without (instance) / on (job) group_left (plan) b > bool 0.1e3 and c"
      ).metrics
    ).toEqual(["a_total", "b", "c"])
    expect(promqlReferences("label_values(quota_partitions_owned, instance)").metrics).toEqual([
      "quota_partitions_owned"
    ])
    expect(promqlReferences("label_values(instance)").metrics).toEqual([])
    expect(promqlReferences('{__name__="quota_slot_waiters", job="q"}').metrics).toEqual([
      "quota_slot_waiters"
    ])
  })

  it("reports a metric the service does not export", () => {
    expect(unknownMetrics("rate(quota_no_such_metric_total[1m])", exported)).toEqual([
      "quota_no_such_metric_total"
    ])
    expect(unknownMetrics("rate(quota_commands_total[1m])", exported)).toEqual([])
  })

  it("reads expr values of every YAML form the rule files may use", () => {
    const yaml = [
      "rules:",
      "  - alert: A",
      "    expr: up == 0 # comment",
      "    for: 1m",
      "  - expr: |",
      "      sum(rate(a_total[5m]))",
      "        > 1",
      "    labels: {}",
      `  - expr: "rate(b_total{job=\\"x\\"}[1m])"`,
      "  - expr: 'c{job=''x''}'",
      "  - expr: d",
      "      > 2"
    ].join("\n")
    expect(ruleExpressions(yaml)).toEqual([
      "up == 0",
      "sum(rate(a_total[5m]))\n  > 1",
      'rate(b_total{job="x"}[1m])',
      "c{job='x'}",
      "d > 2"
    ])
  })

  it("finds the dashboard's expressions, in rows and template variables", () => {
    expect(panelExpressions.length).toBe(countExprKeys(dashboard))
    expect(panelExpressions.length).toBeGreaterThanOrEqual(20)
    expect(variableExpressions).toContain("label_values(quota_partitions_owned, instance)")
    // The Process row is collapsed: its panels are nested in it.
    expect(panels.some((panel) => panel.type === "row" && (panel.panels?.length ?? 0) > 0)).toBe(true)
  })

  it("dashboard: every metric is exported and every function is PromQL's", () => {
    const problems = dashboardExpressions.flatMap((expr) => [
      ...unknownMetrics(expr, exported).map((metric) => `unknown metric ${metric} in ${expr}`),
      ...promqlReferences(expr)
        .functions.filter((fn) => !knownFunctions.has(fn))
        .map((fn) => `unknown function ${fn} in ${expr}`)
    ])
    expect(problems).toEqual([])
  })

  it("dashboard: every referenced metric has a series once each kind was observed", () => {
    const referenced = new Set(dashboardExpressions.flatMap((expr) => promqlReferences(expr).metrics))
    expect([...referenced].filter((metric) => !sampled.has(metric))).toEqual([])
  })

  it("dashboard: charts every quota_* metric the service exports", () => {
    const referenced = new Set(dashboardExpressions.flatMap((expr) => promqlReferences(expr).metrics))
    const charted = (name: string) =>
      ["", "_bucket", "_sum", "_count"].some((suffix) => referenced.has(name + suffix))
    const quotaMetrics = [...exported].filter(
      (name) => name.startsWith("quota_") && !/_(bucket|sum|count)$/.test(name)
    )
    expect(quotaMetrics.length).toBeGreaterThan(0)
    expect(quotaMetrics.filter((name) => !charted(name))).toEqual([])
  })

  it("dashboard: every panel and query uses the Prometheus data source variable", () => {
    const allowed = new Set(["${DS_PROMETHEUS}", "prometheus"])
    const sources = panels
      .filter((panel) => panel.type !== "row")
      .flatMap((panel) => [
        panel.datasource?.uid,
        ...(panel.targets ?? []).map((target) => target.datasource?.uid)
      ])
    expect(sources.filter((uid) => !allowed.has(uid ?? ""))).toEqual([])
  })

  it("alerts: every expression's metrics are exported and functions are PromQL's", () => {
    expect(alertExpressions.length).toBe(alertsYaml.match(/^\s*- alert:/gm)?.length)
    expect(alertExpressions.length).toBeGreaterThanOrEqual(7)
    const problems = alertExpressions.flatMap((expr) => [
      ...unknownMetrics(expr, exported).map((metric) => `unknown metric ${metric} in ${expr}`),
      ...promqlReferences(expr)
        .functions.filter((fn) => !knownFunctions.has(fn))
        .map((fn) => `unknown function ${fn} in ${expr}`)
    ])
    expect(problems).toEqual([])
  })
})
