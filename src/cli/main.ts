#!/usr/bin/env node
/** The `quota-coordinator` process: runs the command line (src/cli/cli.ts) and exits with its code. */
import { once } from "node:events"
import { runCli } from "./cli.js"

// A reader that went away (`report ... | head`): the output can go nowhere, so stop as a failure
// rather than crash on the unheard error.
process.stdout.on("error", (error) => {
  process.stderr.write(`quota-coordinator: stdout: ${error.message}\n`)
  process.exit(2)
})

runCli(process.argv.slice(2), {
  env: process.env,
  // Resolves once the pipe takes more when it is full, so `report` streams instead of buffering.
  stdout: (text) =>
    process.stdout.write(text) ? undefined : once(process.stdout, "drain").then(() => undefined),
  stderr: (text) => process.stderr.write(text),
  stdoutIsTerminal: process.stdout.isTTY === true,
  stderrIsTerminal: process.stderr.isTTY === true
}).then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`quota-coordinator: ${error instanceof Error ? error.message : String(error)}\n`)
    process.exit(1)
  }
)
