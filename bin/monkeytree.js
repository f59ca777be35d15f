#!/usr/bin/env node
// The CLI is TypeScript run in place; tsx compiles it on load so there is no build step.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../cli/main.ts");
process.exitCode = await main(process.argv.slice(2), { out: process.stdout, err: process.stderr });
