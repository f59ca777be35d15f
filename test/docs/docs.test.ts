import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, it } from "vitest";
import { runCli } from "../helpers/cli.ts";

/**
 * The documentation's snippets, run as a reader pastes them: README.md, sdk/python/README.md and
 * every docs/*.md. A fenced block is run when the line before it is a marker:
 *
 *   <!-- test: file NAME -->            the block is saved as NAME in the reader's directory
 *   <!-- test: run -->                  every command of the sh block exits 0 there
 *   <!-- test: transcript[, exit N] --> `$ COMMAND`, then what it prints (stdout and stderr as a
 *                                       terminal shows them); timings and this checkout's path
 *                                       may differ, nothing else
 *
 * and is left alone when it is one of:
 *
 *   <!-- test: needs WHAT -->           commands this machine cannot run (a GPU cluster, Slurm,
 *   <!-- test: not run: WHY -->         root, minutes of work); their flags are still checked
 *   <!-- test: output -->               what a command printed, no commands
 *
 * Every sh (or unlabelled) block carries one of these markers. Each markdown file has a reader's
 * directory of its own, holding the package installed (node_modules/monkeytree is this
 * checkout, which resolves to the compiled dist/ that `npm test` builds first), `monkeytree` on
 * PATH and that file's `file` blocks. Besides, in every file, every flag given to a `monkeytree`
 * command or an `npm run` script must be one its --help lists, every npm script named must
 * exist, every path it links or names must exist, and every link's #anchor must name a heading
 * of the markdown file it points into.
 */

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const FILES = [
  "README.md",
  "sdk/python/README.md",
  ...readdirSync(join(ROOT, "docs"))
    .filter((name) => name.endsWith(".md"))
    .sort()
    .map((name) => `docs/${name}`),
];

interface Block {
  readonly line: number;
  readonly lang: string;
  readonly marker: string | null;
  readonly body: string;
}

/** A marker's kind, or null for one this test does not know. */
function markerKind(marker: string): "file" | "run" | "transcript" | "skip" | "output" | null {
  if (/^file \S+$/.test(marker)) return "file";
  if (marker === "run") return "run";
  if (/^transcript(, exit \d+)?$/.test(marker)) return "transcript";
  if (/^(needs|not run:) \S/.test(marker)) return "skip";
  if (marker === "output") return "output";
  return null;
}

const isShell = (block: Block): boolean => block.lang === "sh" || block.lang === "";

class Doc {
  readonly text: string;
  readonly blocks: Block[] = [];
  /** The text with every fenced block's lines emptied, so that offsets still give line numbers. */
  readonly prose: string;

  constructor(readonly file: string) {
    this.text = readFileSync(join(ROOT, file), "utf8");
    const lines = this.text.split("\n");
    const prose = [...lines];
    for (let i = 0; i < lines.length; i++) {
      const open = /^```(\w*)$/.exec(lines[i]!);
      if (!open) continue;
      const end = lines.indexOf("```", i + 1);
      if (end < 0) throw new Error(`${file}:${i + 1}: unclosed code block`);
      const marker = /^<!-- test: (.+) -->$/.exec(lines[i - 1] ?? "")?.[1] ?? null;
      this.blocks.push({ line: i + 1, lang: open[1]!, marker, body: lines.slice(i + 1, end).join("\n") });
      prose.fill("", i, end + 1);
      i = end;
    }
    this.prose = prose.join("\n");
  }

  /** `file:line` of an offset into the text (or the prose, which keeps its lines). */
  at(offset: number): string {
    return `${this.file}:${this.text.slice(0, offset).split("\n").length}`;
  }

  /** Inline code spans outside fenced blocks, each with where it is. */
  inlineCode(): { code: string; where: string }[] {
    return [...this.prose.matchAll(/`([^`]+)`/g)].map((m) => ({ code: m[1]!.replaceAll("\n", " "), where: this.at(m.index) }));
  }

  /** Link targets outside code: `[text](target)`, with where each is. */
  links(): { target: string; where: string }[] {
    const prose = this.prose.replace(/`[^`]+`/g, (code) => code.replace(/[^\n]/g, " "));
    return [...prose.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)].map((m) => ({ target: m[1]!, where: this.at(m.index) }));
  }

  /** The commands of its shell blocks (outputs left out) and of its inline code, each with where it is. */
  commandLines(): { line: string; where: string }[] {
    const fenced = this.blocks
      .filter((b) => isShell(b) && b.marker !== "output")
      .flatMap((b) => commandLines(b.body).map((line) => ({ line, where: `${this.file}:${b.line}` })));
    return [...fenced, ...this.inlineCode().map(({ code, where }) => ({ line: code, where }))];
  }
}

const DOCS = FILES.map((file) => new Doc(file));

/** A command's lines with `\` continuations joined, blank and comment-only lines left out. */
const commandLines = (body: string): string[] =>
  body
    .replace(/\\\n\s*/g, " ")
    .split("\n")
    .filter((line) => line.trim() !== "" && !line.trimStart().startsWith("#"));

/** GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, each space a `-`. */
const slug = (heading: string): string =>
  heading
    .replace(/\[([^\]]*)\]\([^)]*\)/g, "$1")
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, "")
    .replace(/ /g, "-");

const anchorCache = new Map<string, Set<string>>();

/** The anchors of a markdown file's headings (outside fenced blocks), repeated ones numbered as GitHub does. */
function anchorsOf(path: string): Set<string> {
  let anchors = anchorCache.get(path);
  if (anchors) return anchors;
  anchors = new Set();
  const seen = new Map<string, number>();
  let fenced = false;
  for (const line of readFileSync(path, "utf8").split("\n")) {
    if (/^```/.test(line)) fenced = !fenced;
    const heading = fenced ? null : /^#{1,6}\s+(.+?)(?:\s+#+)?\s*$/.exec(line)?.[1];
    if (!heading) continue;
    const base = slug(heading);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  anchorCache.set(path, anchors);
  return anchors;
}

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
  readonly dir = mkdtempSync(join(tmpdir(), "monkeytree-docs-"));
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
    if (bare === "run" && words[i - 1]?.bare === "npm" && words[i + 2]?.bare === "--")
      return [...nested, { target: `npm run ${next}`, flags: flagsFrom(i + 3) }];
    return nested;
  });
}

/**
 * The flags a --help text lists: those of its usage (the text before the first blank line), of its
 * options section (each option line's part before its description), and of any other section's
 * option lines (`--merge FILES   comma-separated …`).
 */
function optionsOf(help: string): Set<string> {
  const start = help.indexOf("\noptions:\n");
  if (start < 0) throw new Error(`no options section in:\n${help}`);
  const flagsIn = (text: string) => [...text.matchAll(/--[a-z][a-z0-9-]*/g)].map((m) => m[0]);
  const section = help.slice(start + "\noptions:\n".length).split("\n\n")[0]!;
  const options = section
    .split("\n")
    .filter((line) => line.trimStart().startsWith("-"))
    .flatMap((line) => flagsIn(line.trimStart().split(/\s{2,}/)[0]!));
  const elsewhere = help.split("\n").flatMap((line) => /^\s*(?:-\w, )?(--[a-z][a-z0-9-]*)(?: [A-Z][\w,.…]*)?(?:\s{2,}|$)/.exec(line)?.[1] ?? []);
  return new Set(["--help", ...flagsIn(help.split("\n\n")[0]!), ...options, ...elsewhere]);
}

const scripts = (JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { scripts: Record<string, string> }).scripts;
const REPO_DIRS = /^(native|sdk|controller|cli|test|bench|examples|bin)\//;

let commandsOnce: Promise<Set<string>> | undefined;

/** The `monkeytree` subcommands, from its --help (asked once for all files). */
function cliCommands(): Promise<Set<string>> {
  commandsOnce ??= runCli("--help").then(({ code, stdout, stderr }) => {
    if (code !== 0) throw new Error(`monkeytree --help exited ${code}: ${stderr}`);
    const section = stdout.slice(stdout.indexOf("commands:\n")).split("\n\n")[0]!;
    return new Set([...section.matchAll(/^ {2}(\w+) /gm)].map((m) => m[1]!));
  });
  return commandsOnce;
}

async function helpOf(target: string, where: string): Promise<string> {
  const script = /^npm run (\S+)$/.exec(target)?.[1];
  if (!script) {
    const { code, stdout, stderr } = await runCli(target, "--help");
    if (code !== 0) throw new Error(`monkeytree ${target} --help exited ${code}: ${stderr}`);
    return stdout;
  }
  const entry = /node bin\/run-ts\.js (\S+)$/.exec(scripts[script] ?? "")?.[1];
  if (!entry) throw new Error(`${where} passes flags to \`npm run ${script}\`, which is not a bench script of package.json`);
  const { code, stdout, stderr } = await run(process.execPath, ["bin/run-ts.js", entry, "--help"], ROOT);
  if (code !== 0) throw new Error(`npm run ${script} -- --help exited ${code}: ${stderr}`);
  return stdout;
}

/** Each command's or script's options, its --help asked once however many files name it. */
const optionsCache = new Map<string, Promise<Set<string>>>();
function optionsFor(target: string, where: string): Promise<Set<string>> {
  let options = optionsCache.get(target);
  if (!options) {
    options = helpOf(target, where).then(optionsOf);
    optionsCache.set(target, options);
  }
  return options;
}

describe("the docs", () => {
  it("are README.md, sdk/python/README.md and docs/*.md, with snippets run, command lines checked and links followed", ({ expect }) => {
    expect(FILES.length).toBeGreaterThan(2);
    expect(DOCS.flatMap((doc) => doc.blocks).filter((b) => b.marker === "run").length).toBeGreaterThan(0);
    expect(DOCS.flatMap((doc) => doc.commandLines()).filter(({ line }) => /\bmonkeytree \w/.test(line)).length).toBeGreaterThan(0);
    expect(DOCS.flatMap((doc) => doc.links()).length).toBeGreaterThan(0);
  });
});

for (const doc of DOCS) {
  const { file, blocks } = doc;
  const runs = blocks.filter((b) => b.marker === "run");
  const transcripts = blocks.filter((b) => b.marker !== null && markerKind(b.marker) === "transcript");

  // Independent runs, in parallel: each is mostly a process starting up, which a loaded machine makes slow.
  describe.concurrent(`${file}'s snippets`, () => {
    let reader: ReaderDir | undefined;

    beforeAll(() => {
      if (runs.length + transcripts.length === 0) return;
      reader = new ReaderDir();
      for (const block of blocks) {
        const name = /^file (\S+)$/.exec(block.marker ?? "")?.[1];
        if (name) reader.write(name, `${block.body}\n`);
      }
      // The bad snapshot of docs/planner.md's error transcript: its fourth job's third host is past the 128 hosts.
      const jobs = [[0], [1], [2], [3, 4, 130]].map((hosts, i) => ({ id: `j${i}`, hosts }));
      reader.write("bad.json", JSON.stringify({ topology: { racks: 16, hostsPerRack: 8, gpusPerHost: 8, uplinksPerRack: 16 }, jobs }));
    });
    afterAll(() => reader?.remove());

    it("are marked with markers this test knows, every shell block and every JS snippet", ({ expect }) => {
      const wrong = blocks.flatMap((b) => {
        const where = `${file}:${b.line}`;
        if (b.marker === null)
          return isShell(b) || b.lang === "js" ? [`${where}: a \`${b.lang || "unlabelled"}\` block without a <!-- test: … --> marker`] : [];
        const kind = markerKind(b.marker);
        if (kind === null) return [`${where}: an unknown marker: ${b.marker}`];
        return (kind === "run" || kind === "transcript") && !isShell(b) ? [`${where}: \`${b.marker}\` on a \`${b.lang}\` block`] : [];
      });
      expect(wrong).toEqual([]);
    });

    for (const block of runs) {
      it(`runs the commands at ${file}:${block.line}, each exiting 0`, async ({ expect }) => {
        for (const line of commandLines(block.body)) {
          const { code, stdout } = await reader!.shell(line);
          expect(code, `${line}\n${stdout}`).toBe(0);
        }
      });
    }

    for (const block of transcripts) {
      it(`prints what the transcript at ${file}:${block.line} shows`, async ({ expect }) => {
        const [command, ...shown] = block.body.split("\n");
        expect(command, "a transcript starts with `$ COMMAND`").toMatch(/^\$ /);
        const { code, stdout } = await reader!.shell(command!.slice(2));
        expect(comparable(stdout)).toEqual(comparable(shown.join("\n")));
        expect(code).toBe(Number(/exit (\d+)/.exec(block.marker!)?.[1] ?? 0));
      });
    }

    // Generous: a bench script's --help starts it through tsx, tens of seconds on a loaded machine.
    it("give every `monkeytree` command and `npm run` script only flags its --help lists", { timeout: 300_000 }, async ({ expect }) => {
      const commands = await cliCommands();
      const used = doc.commandLines().flatMap(({ line, where }) => invocations(line, commands).map((call) => ({ ...call, line, where })));
      const checked = await Promise.all(
        used.map(async ({ target, flags, line, where }) => {
          const options = await optionsFor(target, where);
          return flags.filter((flag) => !options.has(flag)).map((flag) => `${where}: ${target} ${flag} in: ${line}`);
        }),
      );
      expect(checked.flat()).toEqual([]);
    });

    it("name only npm scripts package.json has", ({ expect }) => {
      // `npm run bench:*` stands for all of them.
      const named = [...doc.text.matchAll(/\bnpm (?:run ([\w:*-]+)|(start|test)\b)/g)]
        .map((m) => ({ name: m[1] ?? m[2]!, where: doc.at(m.index) }))
        .filter(({ name }) => !name.endsWith("*"));
      expect(named.filter(({ name }) => !(name in scripts)).map(({ name, where }) => `${where}: npm run ${name}`)).toEqual([]);
    });

    it("link and name only files that exist, and only headings that exist", ({ expect }) => {
      const broken: string[] = [];
      for (const { target, where } of doc.links()) {
        if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue;
        const hash = target.indexOf("#");
        const path = hash < 0 ? target : target.slice(0, hash);
        const anchor = hash < 0 ? null : decodeURIComponent(target.slice(hash + 1));
        const resolved = path === "" ? join(ROOT, file) : join(ROOT, dirname(file), path);
        if (!existsSync(resolved)) broken.push(`${where}: ${target}: no ${relative(ROOT, resolved)}`);
        else if (anchor !== null && resolved.endsWith(".md") && !anchorsOf(resolved).has(anchor)) {
          broken.push(`${where}: ${target}: ${relative(ROOT, resolved)} has no heading #${anchor}`);
        }
      }
      for (const m of doc.text.matchAll(/`([^`\s]+)`/g)) {
        if (REPO_DIRS.test(m[1]!) && !existsSync(join(ROOT, m[1]!))) broken.push(`${doc.at(m.index)}: \`${m[1]}\`: no such path`);
      }
      expect(broken).toEqual([]);
    });
  });
}
