import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    // Compiles src/ once, so tests that start `serve` as a process start it as deployed; deletes the
    // events streams earlier runs left behind (test/support/eventStreams.ts).
    globalSetup: ["test/support/buildServe.ts", "test/support/cleanStreams.ts"],
    include: ["test/**/*.test.ts"],
    // Multi-process failover tests run on their own: `npm run test:cluster` (vitest.cluster.config.ts),
    // and the Patroni stack's `npm run test:ha` (vitest.ha.config.ts).
    exclude: ["test/cluster/**", "test/ha/**", "node_modules/**"],
    testTimeout: 60_000,
    hookTimeout: 60_000
  }
})
