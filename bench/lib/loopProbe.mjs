/**
 * Preloaded into the coordinator by bench/abuse.ts (`--import`, through BENCH_COORDINATOR_NODE_FLAGS;
 * nothing in src/ changes). A 10 ms timer measures how late the event loop runs it, finer than the
 * /metrics gauge (sampled every 100 ms, so it reads at least 100 ms and up to a stall + 100 ms), and
 * every 250 ms appends `<epoch ms> <longest gap ms> <CPU ms the process used during that gap>` to
 * ABUSE_LOOP_PROBE_FILE. A gap is the time between two runs of the timer: 10 ms plus the delay, so a
 * stall of S ms reads S to S + 10. The CPU time (process.cpuUsage: every thread of the process, GC
 * helpers included) tells the coordinator's own work (CPU close to the gap) from waiting for a core on
 * a machine shared with other work (CPU well under the gap).
 */
import { appendFileSync } from "node:fs"
import { performance } from "node:perf_hooks"
import process from "node:process"
import { setInterval, setTimeout } from "node:timers"

const file = process.env["ABUSE_LOOP_PROBE_FILE"]
if (file !== undefined && file !== "") {
  let last = performance.now()
  let lastCpu = process.cpuUsage()
  let worst = { gap: 0, cpu: 0 }
  const tick = () => {
    const now = performance.now()
    const cpu = process.cpuUsage()
    const gap = now - last
    if (gap > worst.gap)
      worst = { gap, cpu: (cpu.user - lastCpu.user + (cpu.system - lastCpu.system)) / 1000 }
    last = now
    lastCpu = cpu
    setTimeout(tick, 10).unref()
  }
  setTimeout(tick, 10).unref()
  setInterval(() => {
    appendFileSync(file, `${Date.now()} ${worst.gap.toFixed(1)} ${worst.cpu.toFixed(1)}\n`)
    worst = { gap: 0, cpu: 0 }
  }, 250).unref()
}

/**
 * With `--expose-gc`, SIGUSR2 runs a full collection and appends `gc <epoch ms> <heap used> <rss>`
 * (bytes): the heap the process retains, without the garbage a scrape of /metrics also counts.
 */
const gc = globalThis.gc
if (file !== undefined && file !== "" && typeof gc === "function")
  process.on("SIGUSR2", () => {
    gc()
    const usage = process.memoryUsage()
    appendFileSync(file, `gc ${Date.now()} ${usage.heapUsed} ${usage.rss}\n`)
  })
