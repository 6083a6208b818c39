import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    // As the cluster suite (vitest.cluster.config.ts): `serve` compiled once and started as deployed;
    // the events streams of earlier runs deleted.
    globalSetup: ["test/support/buildServe.ts", "test/support/cleanStreams.ts"],
    // The Patroni stack (scripts/ha-stack.sh): etcd, two Postgres 15 under Patroni, HAProxy.
    include: ["test/ha/**/*.test.ts"],
    fileParallelism: false,
    testTimeout: 240_000,
    hookTimeout: 120_000
  }
})
