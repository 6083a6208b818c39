import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    // Compiles src/ once, so tests that start `serve` as a process start it as deployed; deletes the
    // events streams earlier runs left behind (test/support/eventStreams.ts).
    globalSetup: ["test/support/buildServe.ts", "test/support/cleanStreams.ts"],
    include: ["test/cluster/**/*.test.ts"],
    // Each file starts several coordinator processes: one file at a time on a 2-core machine.
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 60_000
  }
})
