/** Where the global setup (buildServe.ts) puts the compiled coordinator, and how to start it. */
import { join } from "node:path"
import { fileURLToPath } from "node:url"

export const repositoryRoot = fileURLToPath(new URL("../../", import.meta.url))

/**
 * In the checkout's own dist/ (ignored by git, eslint and prettier; packages resolve from the
 * checkout's node_modules above it): a worktree whose node_modules links to another checkout's would
 * otherwise build into, and run, that checkout's directory, which every run there rebuilds.
 */
export const compiledServeDirectory = join(repositoryRoot, "dist/test-build")

/** `node` arguments that run the compiled CLI's `serve` as the Dockerfile does. */
export const compiledServeArguments: ReadonlyArray<string> = [
  "--max-semi-space-size=64",
  join(compiledServeDirectory, "src/cli/main.js"),
  "serve"
]
