#!/usr/bin/env node
/** The `quota-coordinator` process: runs the command line (src/cli/cli.ts) and exits with its code. */
import { runCli } from "./cli.js"

runCli(process.argv.slice(2), {
  env: process.env,
  stdout: (text) => process.stdout.write(text),
  stderr: (text) => process.stderr.write(text)
}).then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`quota-coordinator: ${error instanceof Error ? error.message : String(error)}\n`)
    process.exit(1)
  }
)
