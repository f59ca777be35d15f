import { createRequire } from "node:module";
import { InvalidInputError } from "../sdk/contract/errors.ts";
import { ExitCode, UsageError, type Command, type Io } from "./io.ts";

/** Subcommands, loaded on demand so `monkeytree plan` does not pay for the others. */
const commands: Record<string, () => Promise<Command>> = {
  plan: async () => (await import("./plan.ts")).command,
  routes: async () => (await import("./routes.ts")).command,
  simulate: async () => (await import("./simulate.ts")).command,
  capabilities: async () => (await import("./capabilities.ts")).command,
  controller: async () => (await import("./controller.ts")).command,
  daemon: async () => (await import("./daemon.ts")).command,
  status: async () => (await import("./status.ts")).command,
  job: async () => (await import("./job.ts")).command,
  demo: async () => (await import("./demo.ts")).command,
  launch: async () => (await import("./launch.ts")).command,
  keys: async () => (await import("./keys.ts")).command,
  slurm: async () => (await import("./slurm.ts")).command,
  checkpoint: async () => (await import("./checkpoint.ts")).command,
};

/** This package's release, from its package.json (the one `npm install` put there, or the checkout's). */
function version(): string {
  return (createRequire(import.meta.url)("monkeytree/package.json") as { version: string }).version;
}

/** Loads every command for its summary; only `--help` and mistakes pay for that. */
async function usage(): Promise<string> {
  const names = Object.keys(commands);
  const summaries = await Promise.all(names.map(async (name) => (await commands[name]!()).summary));
  const width = Math.max(...names.map((n) => n.length));
  return [
    "usage: monkeytree <command> [options]",
    "",
    "Keeps multi-tenant GPU training clusters congestion-free by migrating workers.",
    "",
    "commands:",
    ...names.map((name, i) => `  ${name.padEnd(width)}  ${summaries[i]}`),
    "",
    "Run `monkeytree <command> --help` for a command's options, `monkeytree --version` for this release.",
  ].join("\n");
}

export async function main(argv: string[], io: Io): Promise<ExitCode> {
  const [name, ...rest] = argv;
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    io.out.write(`${await usage()}\n`);
    return name === undefined ? ExitCode.usage : ExitCode.ok;
  }
  if (name === "--version" || name === "-V") {
    io.out.write(`monkeytree ${version()}\n`);
    return ExitCode.ok;
  }
  const load = commands[name];
  if (!load) {
    io.err.write(`monkeytree: unknown command "${name}"\n${await usage()}\n`);
    return ExitCode.usage;
  }
  const command = await load();
  // Arguments after `--` belong to the wrapped command (`launch -- torchrun --help`).
  const own = rest.includes("--") ? rest.slice(0, rest.indexOf("--")) : rest;
  if (own.includes("--help") || own.includes("-h")) {
    io.out.write(`${command.help}\n`);
    return ExitCode.ok;
  }
  try {
    return await command.run(rest, io);
  } catch (error) {
    if (error instanceof UsageError) {
      io.err.write(`monkeytree ${name}: ${error.message}\nRun \`monkeytree ${name} --help\` for usage.\n`);
      return ExitCode.usage;
    }
    if (error instanceof InvalidInputError) {
      io.err.write(`monkeytree ${name}: ${error.message}\n`);
      return ExitCode.usage;
    }
    io.err.write(`monkeytree ${name}: internal error: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    return ExitCode.internal;
  }
}
