import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, it } from "vitest";
import { runCli } from "../helpers/cli.ts";

/**
 * The README's snippets, run as a reader pastes them. A fenced block is run when the line
 * before it is a marker:
 *
 *   <!-- test: file NAME -->            the block is saved as NAME in the reader's directory
 *   <!-- test: run -->                  every command of the sh block exits 0 there
 *   <!-- test: transcript[, exit N] --> `$ COMMAND`, then what it prints (stdout and stderr as a
 *                                       terminal shows them); timings and this checkout's path
 *                                       may differ, nothing else
 *
 * The reader's directory has the package installed (node_modules/monkeytree is this checkout,
 * which resolves to the compiled dist/ that `npm test` builds first) and `monkeytree` on PATH.
 * Besides, every flag given to a `monkeytree` command or an `npm run` script anywhere in the
 * README must be one its --help lists, and every path it links or names must exist.
 */

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const README = "README.md";
const text = readFileSync(join(ROOT, README), "utf8");

interface Block {
  readonly line: number;
  readonly lang: string;
  readonly marker: string | null;
  readonly body: string;
}

function fencedBlocks(markdown: string): Block[] {
  const lines = markdown.split("\n");
  const blocks: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^```(\w*)$/.exec(lines[i]!);
    if (!open) continue;
    const end = lines.indexOf("```", i + 1);
    if (end < 0) throw new Error(`${README}:${i + 1}: unclosed code block`);
    const marker = /^<!-- test: (.+) -->$/.exec(lines[i - 1] ?? "")?.[1] ?? null;
    blocks.push({ line: i + 1, lang: open[1]!, marker, body: lines.slice(i + 1, end).join("\n") });
    i = end;
  }
  return blocks;
}

const blocks = fencedBlocks(text);
const prose = text.replace(/^```\w*\n[\s\S]*?^```$/gm, "");
const inlineCode = [...prose.matchAll(/`([^`]+)`/g)].map((m) => m[1]!.replaceAll("\n", " "));

/** A command's lines with `\` continuations joined, blank and comment-only lines left out. */
const commandLines = (body: string): string[] =>
  body
    .replace(/\\\n\s*/g, " ")
    .split("\n")
    .filter((line) => line.trim() !== "" && !line.trimStart().startsWith("#"));

interface Result {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

function run(program: string, args: readonly string[], cwd: string, env: NodeJS.ProcessEnv = process.env): Promise<Result> {
  return new Promise((resolve, reject) => {
    const child = spawn(program, args, { cwd, env, stdio: ["ignore", "pipe", "pipe"] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on("data", (chunk: Buffer) => out.push(chunk));
    child.stderr.on("data", (chunk: Buffer) => err.push(chunk));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() }));
  });
}

/** Where a pasted command runs: `monkeytree` is the checkout's CLI, as `npx monkeytree` finds it once installed. */
class ReaderDir {
  readonly dir = mkdtempSync(join(tmpdir(), "monkeytree-readme-"));
  private readonly env: NodeJS.ProcessEnv;

  constructor() {
    const bin = join(this.dir, ".bin");
    mkdirSync(bin);
    writeFileSync(join(bin, "monkeytree"), `#!/bin/sh\nexec "${process.execPath}" "${join(ROOT, "bin/monkeytree.js")}" "$@"\n`, { mode: 0o755 });
    mkdirSync(join(this.dir, "node_modules"));
    symlinkSync(ROOT, join(this.dir, "node_modules/monkeytree"));
    this.env = { ...process.env, PATH: [bin, dirname(process.execPath), process.env.PATH].join(":") };
  }

  /** One command line through /bin/sh, stderr into the same pipe as stdout, as a terminal shows both. */
  shell(line: string): Promise<Result> {
    return run("/bin/sh", ["-c", `exec 2>&1; ${line.replace(/\bnpx monkeytree\b/g, "monkeytree")}`], this.dir, this.env);
  }

  write(name: string, body: string): void {
    writeFileSync(join(this.dir, name), body);
  }

  remove(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}

const DURATION = /\b\d+(?:\.\d+)? ?m?s\b/g;

/** [from, to) of each column whose header names milliseconds ("solve ms/plan"), in a header of three or more cells. */
function timingColumns(header: string): (readonly [number, number])[] {
  const cells = [...header.matchAll(/\S+(?: \S+)*/g)].map((m) => ({ text: m[0], end: m.index + m[0].length }));
  if (cells.length < 3) return [];
  return cells.flatMap((cell, c) => (/\bms\b/.test(cell.text) ? [[c === 0 ? 0 : cells[c - 1]!.end, cell.end] as const] : []));
}

/** Blanks the timing columns' values in the rows under their header, up to the next blank line. */
function blankTimingColumns(lines: readonly string[]): string[] {
  const out = [...lines];
  out.forEach((header, i) => {
    const spans = timingColumns(header);
    for (let j = i + 1; spans.length > 0 && j < out.length && out[j] !== ""; j++) {
      out[j] = spans.reduce((row, [from, to]) => row.slice(0, from).padEnd(from) + " ".repeat(to - from) + row.slice(to), out[j]!);
    }
  });
  return out;
}

/** What must match between a transcript and a run: everything but timings, trailing spaces and this checkout's path. */
const comparable = (output: string): string[] =>
  blankTimingColumns(output.replaceAll(ROOT, "…/").trimEnd().split("\n")).map((line) => line.replace(DURATION, "<time>").trimEnd());

/**
 * Every `monkeytree CMD …` and `npm run SCRIPT -- …` in a shell line, with the flags given to it;
 * a command inside a quoted word (a daemon's --replacement) counts on its own.
 */
function invocations(line: string, commands: ReadonlySet<string>): { target: string; flags: string[] }[] {
  const words = (line.match(/(?:[^\s'"]+|'[^']*'|"[^"]*")+/g) ?? []).map((word) => ({
    bare: word.replace(/'[^']*'|"[^"]*"/g, ""),
    quoted: [...word.matchAll(/'([^']*)'|"([^"]*)"/g)].map((m) => m[1] ?? m[2]!),
  }));
  const flagsFrom = (start: number) => {
    const flags: string[] = [];
    for (const { bare, quoted } of words.slice(start)) {
      if (quoted.length === 0 && (bare === "--" || /^[#|&;]/.test(bare))) break;
      const flag = /^\[?(--[a-z][a-z0-9-]*)/.exec(bare)?.[1];
      if (flag) flags.push(flag);
    }
    return flags;
  };
  return words.flatMap(({ bare, quoted }, i) => {
    const next = words[i + 1]?.bare ?? "";
    const nested = quoted.flatMap((inner) => invocations(inner, commands));
    if (/(^|\/)monkeytree(\.js)?$/.test(bare) && commands.has(next)) return [...nested, { target: next, flags: flagsFrom(i + 2) }];
    if (bare === "run" && words[i - 1]?.bare === "npm" && words[i + 2]?.bare === "--") return [...nested, { target: `npm run ${next}`, flags: flagsFrom(i + 3) }];
    return nested;
  });
}

/** The flags a --help text's options section lists (each option line's part before its description). */
function optionsOf(help: string): Set<string> {
  const start = help.indexOf("\noptions:\n");
  if (start < 0) throw new Error(`no options section in:\n${help}`);
  const section = help.slice(start + "\noptions:\n".length).split("\n\n")[0]!;
  const flags = section
    .split("\n")
    .filter((line) => line.trimStart().startsWith("-"))
    .flatMap((line) => [...line.trimStart().split(/\s{2,}/)[0]!.matchAll(/--[a-z][a-z0-9-]*/g)].map((m) => m[0]));
  return new Set(["--help", ...flags]);
}

async function cliCommands(): Promise<Set<string>> {
  const { code, stdout, stderr } = await runCli("--help");
  if (code !== 0) throw new Error(`monkeytree --help exited ${code}: ${stderr}`);
  const section = stdout.slice(stdout.indexOf("commands:\n")).split("\n\n")[0]!;
  return new Set([...section.matchAll(/^ {2}(\w+) /gm)].map((m) => m[1]!));
}

async function helpOf(target: string): Promise<string> {
  const script = /^npm run (\S+)$/.exec(target)?.[1];
  if (!script) {
    const { code, stdout, stderr } = await runCli(target, "--help");
    if (code !== 0) throw new Error(`monkeytree ${target} --help exited ${code}: ${stderr}`);
    return stdout;
  }
  const entry = /node bin\/run-ts\.js (\S+)$/.exec(scripts[script] ?? "")?.[1];
  if (!entry) throw new Error(`${README} passes flags to \`npm run ${script}\`, which is not a bench script of package.json`);
  const { code, stdout, stderr } = await run(process.execPath, ["bin/run-ts.js", entry, "--help"], ROOT);
  if (code !== 0) throw new Error(`npm run ${script} -- --help exited ${code}: ${stderr}`);
  return stdout;
}

const scripts = (JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts;
const REPO_DIRS = /^(native|sdk|controller|cli|test|bench|examples|bin)\//;

// Independent runs, in parallel: each is mostly a process starting up, which a loaded machine makes slow.
describe.concurrent(`${README}'s snippets`, () => {
  let reader: ReaderDir;

  beforeAll(() => {
    reader = new ReaderDir();
    for (const block of blocks) {
      const name = /^file (\S+)$/.exec(block.marker ?? "")?.[1];
      if (name) reader.write(name, `${block.body}\n`);
    }
    // The bad snapshot the README's error transcript plans: its fourth job's third host is past the 128 hosts.
    const jobs = [[0], [1], [2], [3, 4, 130]].map((hosts, i) => ({ id: `j${i}`, hosts }));
    reader.write("bad.json", JSON.stringify({ topology: { racks: 16, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: 16 }, jobs }));
  });
  afterAll(() => reader?.remove());

  it("are marked with markers this test knows, and every JS snippet is one of them", ({ expect }) => {
    const known = /^(file \S+|run|transcript(, exit \d+)?)$/;
    expect(blocks.filter((b) => b.marker !== null && !known.test(b.marker)).map((b) => `${README}:${b.line}: ${b.marker}`)).toEqual([]);
    expect(blocks.filter((b) => b.lang === "js" && b.marker === null).map((b) => `${README}:${b.line}`)).toEqual([]);
    expect(blocks.filter((b) => b.marker === "run").length).toBeGreaterThan(0);
  });

  for (const block of blocks.filter((b) => b.marker === "run")) {
    it(`runs the commands at ${README}:${block.line}, each exiting 0`, async ({ expect }) => {
      for (const line of commandLines(block.body)) {
        const { code, stdout } = await reader.shell(line);
        expect(code, `${line}\n${stdout}`).toBe(0);
      }
    });
  }

  for (const block of blocks.filter((b) => b.marker?.startsWith("transcript"))) {
    it(`prints what the transcript at ${README}:${block.line} shows`, async ({ expect }) => {
      const [command, ...shown] = block.body.split("\n");
      expect(command, "a transcript starts with `$ COMMAND`").toMatch(/^\$ /);
      const { code, stdout } = await reader.shell(command!.slice(2));
      expect(comparable(stdout)).toEqual(comparable(shown.join("\n")));
      expect(code).toBe(Number(/exit (\d+)/.exec(block.marker!)?.[1] ?? 0));
    });
  }
});

describe.concurrent(`${README}'s command lines`, () => {
  it("give every `monkeytree` command and `npm run` script only flags its --help lists", async ({ expect }) => {
    const commands = await cliCommands();
    const lines = [...blocks.filter((b) => b.lang === "sh" || b.lang === "").flatMap((b) => commandLines(b.body)), ...inlineCode];
    const used = lines.flatMap((line) => invocations(line, commands).map((call) => ({ ...call, line })));
    expect(used.length).toBeGreaterThan(0);
    const targets = [...new Set(used.map((u) => u.target))];
    const options = new Map(await Promise.all(targets.map(async (t) => [t, optionsOf(await helpOf(t))] as const)));
    const unknown = used.flatMap(({ target, flags, line }) => flags.filter((f) => !options.get(target)!.has(f)).map((f) => `${target} ${f} in: ${line}`));
    expect(unknown).toEqual([]);
  });

  it("name only npm scripts package.json has", ({ expect }) => {
    // `npm run bench:*` stands for all of them.
    const named = [...text.matchAll(/\bnpm (?:run ([\w:*-]+)|(start|test)\b)/g)].map((m) => m[1] ?? m[2]!).filter((name) => !name.endsWith("*"));
    expect(named.length).toBeGreaterThan(0);
    expect(named.filter((name) => !(name in scripts))).toEqual([]);
  });
});

describe("the READMEs' links and paths", () => {
  for (const file of [README, "sdk/python/README.md"]) {
    it(`point at files that exist, from ${file}`, ({ expect }) => {
      const markdown = readFileSync(join(ROOT, file), "utf8");
      const links = [...markdown.matchAll(/\]\(([^)#\s]+)\)/g)].map((m) => m[1]!).filter((target) => !/^[a-z]+:/.test(target));
      const paths = [...markdown.matchAll(/`([^`\s]+)`/g)].map((m) => m[1]!).filter((path) => REPO_DIRS.test(path));
      expect(links.length + paths.length).toBeGreaterThan(0);
      const missing = [...links.map((l) => join(ROOT, dirname(file), l)), ...paths.map((p) => join(ROOT, p))].filter((path) => !existsSync(path));
      expect(missing.map((path) => path.replace(ROOT, ""))).toEqual([]);
    });
  }
});
