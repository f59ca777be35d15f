/** The `monkeytree` command as a process: `bin/monkeytree.js` runs the compiled form. */
import { main } from "./main.ts";

process.exitCode = await main(process.argv.slice(2), { out: process.stdout, err: process.stderr });
