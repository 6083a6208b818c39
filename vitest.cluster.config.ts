import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/cluster/**/*.test.ts"],
    // Each file starts several coordinator processes: one file at a time on a 2-core machine.
    fileParallelism: false,
    testTimeout: 180_000,
    hookTimeout: 60_000
  }
})
