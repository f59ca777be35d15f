import { spawn } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { errnoReason, InvalidInputError, quote } from "../sdk/contract/errors.ts";
import { CRC32C_LIBRARY_ENV } from "../sdk/contract/protocol/channel.ts";
import { bool, helpText, int, list, parseArgsOptions, parseCommandFlags, required, str } from "./flags.ts";
import { ExitCode, SHM, UsageError, type Command, type Io } from "./io.ts";

const PER_SOURCE_DEFAULTS = "rng, *.rng and *rng_state*";

const FLAGS = {
  buffer: list("NAME", `a staging buffer, ${SHM}/NAME`),
  file: list("PATH", "a file holding a copy of a staging buffer (--buffer and --file repeat; sources count from 0 in the order given)"),
  ranges: int(
    "N",
    "each source holds N local processes' checkpoints, one per page-aligned share, as `monkeytree launch --checkpoint-bytes` " +
      "splits its staging among torchrun's processes",
    { default: 1, min: 1 },
  ),
  offset: int("BYTES", "where the checkpoint (with --ranges, the first) starts in each source", { default: 0, min: 0 }),
  length: int("BYTES", "bytes from --offset that the checkpoints may use (default: the rest)", { min: 1 }),
  out: required("DIR", "the DCP checkpoint directory to write, new or empty", "the directory to write the DCP checkpoint into"),
  overwrite: bool("replace DIR when it holds something"),
  "per-source": list("PATTERN", `fqns (shell patterns) of per-process state, besides ${PER_SOURCE_DEFAULTS}`),
  python: str("PATH", "the interpreter with torch and the monkeytree package (default $MONKEYTREE_PYTHON, else python3)"),
  json: bool("print what was written as one JSON object"),
};

const help = helpText({
  command: "monkeytree checkpoint export",
  table: FLAGS,
  about: `Writes staged checkpoints (a launcher's or a daemon's staging buffer, or a copy of one in a
file) as one standard PyTorch DCP checkpoint directory: torch.distributed.checkpoint.load reads
it with FileSystemReader(DIR) and no MonkeyTree, to inspect a moved worker's state or resume
from it. Every blob's CRC32C is verified first. Tensor chunks of one fqn from several sources
(FSDP shards saved by different ranks) become chunks of one tensor; what several sources hold
identically (replicated parameters, param_groups) is written once, and differing values are an
error naming the fqn, except for per-process items (--per-source): with several sources, each
source's is kept as monkeytree.source<i>.<fqn>, and <fqn> holds source 0's. DIR is written
beside itself and renamed into place at the end, so a failed export leaves nothing.

It runs the hook's exporter, \`PYTHON -m monkeytree export\`, which needs torch and the
monkeytree Python package (pip install sdk/python).`,
  after: `exit codes: 0 written, 2 bad usage or input (a source that is missing or holds no valid
checkpoint, a corrupt blob, sources that disagree, DIR not empty, no usable --python),
3 internal error.`,
});

/** What `StagingBuffer.create` accepts as a name (native/index.ts). */
const SHM_NAME = /^[A-Za-z0-9._-]{1,200}$/;
/** The exporter's own prefix on its error lines, replaced by this command's. */
const PYTHON_PREFIX = "python3 -m monkeytree export: ";

interface Ran {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
  readonly error?: NodeJS.ErrnoException;
}

function run(program: string, args: string[], env: NodeJS.ProcessEnv): Promise<Ran> {
  return new Promise((resolve) => {
    const child = spawn(program, args, { env, stdio: ["ignore", "pipe", "pipe"] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on("data", (chunk: Buffer) => out.push(chunk));
    child.stderr.on("data", (chunk: Buffer) => err.push(chunk));
    let failed: NodeJS.ErrnoException | undefined;
    child.on("error", (error) => (failed = error));
    child.on("close", (code) =>
      resolve({ code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString(), ...(failed ? { error: failed } : {}) }),
    );
  });
}

/** The addon's CRC32C library for the exporter, unless the environment names one; without it the hook checksums in torch, about 30 times slower. */
async function crcLibrary(): Promise<Record<string, string>> {
  if (process.env[CRC32C_LIBRARY_ENV]) return {};
  try {
    const { crc32cLibraryPath } = await import("../native/index.ts");
    return { [CRC32C_LIBRARY_ENV]: crc32cLibraryPath };
  } catch {
    return {};
  }
}

/** The sources in the order given, as the exporter's flags. */
function sourceArgs(argv: string[]): string[] {
  let tokens;
  try {
    tokens = parseArgs({ args: argv, options: parseArgsOptions(FLAGS), allowPositionals: false, strict: true, tokens: true }).tokens;
  } catch (error) {
    throw new UsageError(error instanceof Error ? error.message : String(error));
  }
  const args: string[] = [];
  for (const token of tokens) {
    if (token.kind !== "option" || (token.name !== "buffer" && token.name !== "file")) continue;
    const value = token.value ?? "";
    if (token.name === "buffer" && (!SHM_NAME.test(value) || value === "." || value === "..")) {
      throw new UsageError(
        `--buffer takes a staging buffer's name in ${SHM} (letters, digits, ".", "_" and "-"), got ${quote(value)}; give a file with --file PATH`,
      );
    }
    const path = token.name === "buffer" ? join(SHM, value) : value;
    if (!existsSync(path)) {
      const hint = token.name === "buffer" ? `; \`ls ${SHM}\` lists the staging buffers` : "";
      throw new InvalidInputError(`--${token.name} ${value}`, [{ path: "", message: `${path} does not exist${hint}` }]);
    }
    args.push(`--${token.name}`, value);
  }
  if (args.length === 0) throw new UsageError(`give the staged checkpoint with --buffer NAME (a staging buffer in ${SHM}) or --file PATH (a copy of one)`);
  return args;
}

/** Refuses a non-empty --out before Python and torch start, naming the flag. */
function checkOut(out: string, overwrite: boolean): void {
  let entries: string[];
  try {
    if (!statSync(out).isDirectory())
      throw new InvalidInputError(`--out ${out}`, [{ path: "", message: "it is a file, not a directory; give a new or empty directory" }]);
    entries = readdirSync(out);
  } catch (error) {
    if (error instanceof InvalidInputError) throw error;
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return;
    throw new InvalidInputError(`--out ${out}`, [{ path: "", message: `cannot read it (${errnoReason(error)}); give a directory this user can write` }]);
  }
  if (entries.length > 0 && !overwrite)
    throw new InvalidInputError(`--out ${out}`, [
      { path: "", message: "it exists and is not empty; give a new or empty directory, or add --overwrite to replace it" },
    ]);
}

/** The exporter's failure as one line of advice, or null when it failed in a way only its output explains. */
function advice(python: string, ran: Ran): string | null {
  const lines = ran.stderr.trim().split("\n");
  const last = lines.at(-1) ?? "";
  if (ran.error) {
    const why = ran.error.code === "ENOENT" ? "no such file" : ran.error.code === "EACCES" ? "permission denied" : errnoReason(ran.error);
    return `--python ${python} cannot be started (${why}): give --python PATH to an interpreter with torch and the monkeytree package, or set $MONKEYTREE_PYTHON`;
  }
  const missing = /No module named '?(monkeytree|torch)\b/.exec(ran.stderr);
  if (missing) {
    const what = missing[1] === "torch" ? "torch" : "the monkeytree package";
    return `--python ${python} cannot import ${what}: install it there (\`pip install sdk/python\` from the MonkeyTree checkout brings both), or give --python PATH to an interpreter that has it`;
  }
  if (/expected --version or --help, got export/.test(ran.stderr)) {
    return `--python ${python} has a monkeytree package without \`export\`: install this version's (\`pip install sdk/python\`), or give --python PATH to an interpreter that has it`;
  }
  if (ran.code === ExitCode.usage && last.startsWith(PYTHON_PREFIX)) return last.slice(PYTHON_PREFIX.length);
  return null;
}

async function exportCheckpoint(argv: string[], io: Io): Promise<ExitCode> {
  const sources = sourceArgs(argv);
  const { ranges, offset, length, ...flags } = parseCommandFlags(argv, FLAGS);
  checkOut(flags.out, flags.overwrite);
  const python = flags.python ?? (process.env.MONKEYTREE_PYTHON || "python3");
  const args = [
    "-m",
    "monkeytree",
    "export",
    ...sources,
    "--ranges",
    String(ranges),
    "--offset",
    String(offset),
    ...(length === undefined ? [] : ["--length", String(length)]),
    "--out",
    flags.out,
    ...(flags.overwrite ? ["--overwrite"] : []),
    ...flags["per-source"].flatMap((pattern) => ["--per-source", pattern]),
    ...(flags.json ? ["--json"] : []),
  ];
  const ran = await run(python, args, { ...process.env, ...(await crcLibrary()) });
  if (ran.code === ExitCode.ok && !ran.error) {
    // Warnings, such as checksums falling back to torch's slower CRC32C.
    io.err.write(ran.stderr);
    io.out.write(ran.stdout);
    return ExitCode.ok;
  }
  const line = advice(python, ran);
  if (line !== null) {
    io.err.write(`monkeytree checkpoint: ${line}\n`);
    return ExitCode.usage;
  }
  io.err.write(ran.stderr);
  io.err.write(
    `monkeytree checkpoint: internal error: ${python} -m monkeytree export ended with ${ran.code === null ? "a signal" : `exit code ${ran.code}`}\n`,
  );
  return ExitCode.internal;
}

export const command: Command = {
  summary: "export a staged checkpoint as a standard DCP checkpoint directory",
  help,
  async run(argv, io) {
    const [sub, ...rest] = argv;
    if (sub === "export") return exportCheckpoint(rest, io);
    if (sub === undefined || sub.startsWith("-")) throw new UsageError("give a subcommand: monkeytree checkpoint export --buffer NAME --out DIR");
    throw new UsageError(`unknown subcommand ${quote(sub)}: the subcommand is export`);
  },
};
