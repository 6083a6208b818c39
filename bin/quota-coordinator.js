#!/usr/bin/env node
// The compiled CLI (npm run build, which `npm install` runs through `prepare`).
import "../dist/src/cli/main.js"
