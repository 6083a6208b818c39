/** Where the global setup (buildServe.ts) puts the compiled coordinator, and how to start it. */
import { join } from "node:path"
import { fileURLToPath } from "node:url"

export const repositoryRoot = fileURLToPath(new URL("../../", import.meta.url))

export const compiledServeDirectory = join(repositoryRoot, "node_modules/.cache/quota-coordinator-test-build")

/** `node` arguments that run the compiled CLI's `serve` as the Dockerfile does. */
export const compiledServeArguments: ReadonlyArray<string> = [
  "--max-semi-space-size=64",
  join(compiledServeDirectory, "src/cli/main.js"),
  "serve"
]
