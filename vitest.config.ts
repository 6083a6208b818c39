import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Multi-process failover tests run on their own: `npm run test:cluster` (vitest.cluster.config.ts).
    exclude: ["test/cluster/**", "node_modules/**"],
    testTimeout: 60_000,
    hookTimeout: 60_000
  }
})
