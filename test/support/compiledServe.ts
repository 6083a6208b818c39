/** Where the global setup (buildServe.ts) puts the compiled coordinator, and how to start it. */
import { createHash } from "node:crypto"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

export const repositoryRoot = fileURLToPath(new URL("../../", import.meta.url))

/**
 * Under node_modules/ so the compiled files resolve its packages; named after the checkout, since
 * worktrees share one node_modules (a symlink) and one checkout's build must not replace another's.
 */
export const compiledServeDirectory = join(
  repositoryRoot,
  "node_modules/.cache",
  `quota-coordinator-test-build-${createHash("sha256").update(repositoryRoot).digest("hex").slice(0, 8)}`
)

/** `node` arguments that run the compiled CLI's `serve` as the Dockerfile does. */
export const compiledServeArguments: ReadonlyArray<string> = [
  "--max-semi-space-size=64",
  join(compiledServeDirectory, "src/cli/main.js"),
  "serve"
]
