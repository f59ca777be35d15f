import { describe, expect, it } from "vitest";
import { bool, checked, choice, helpText, int, list, parseCommandFlags, required, seconds, size, str } from "../../cli/flags.ts";
import { UsageError } from "../../cli/io.ts";
import { runCli } from "../helpers/cli.ts";

const FLAGS = {
  job: required("J", "the job to end", "the job to end"),
  json: bool("print JSON"),
  snapshot: str("FILE", "the cluster snapshot"),
  bind: str("ADDR", "where to listen", { default: "tcp://127.0.0.1:5555" }),
  steps: int("N", "iterations to train", { default: 40, min: 2 }),
  host: int("H", "a host", { min: 0 }),
  timeout: seconds("S", "give up after S seconds", { default: 5, min: 0.1 }),
  staging: size("SIZE", "staging for one checkpoint", { default: 1024, show: "1 KiB" }),
  mode: choice(["bounded", "ignore"], "how comments count", "bounded"),
  exclude: list("GLOB", "leave out files matching GLOB; give it again for more"),
  even: checked("N", "an even number", (value, name) => {
    if (Number(value) % 2 !== 0) throw new UsageError(`--${name} must be even, got "${value}"`);
    return Number(value);
  }),
};

const refusal = (argv: string[]): string => {
  try {
    parseCommandFlags(argv, FLAGS);
  } catch (error) {
    if (error instanceof UsageError) return error.message;
    throw error;
  }
  throw new Error(`${argv.join(" ")} was taken`);
};

describe("a command's flag table", () => {
  it("gives every flag its checked value, and its default when absent", () => {
    expect(parseCommandFlags(["--job", "a"], FLAGS)).toEqual({
      job: "a",
      json: false,
      snapshot: undefined,
      bind: "tcp://127.0.0.1:5555",
      steps: 40,
      host: undefined,
      timeout: 5_000,
      staging: 1024,
      mode: "bounded",
      exclude: [],
      even: undefined,
    });
    const given = ["--job=b", "--json", "--steps", "2", "--host", "0", "--timeout", "0.5", "--staging", "2KiB", "--mode", "ignore"];
    expect(parseCommandFlags([...given, "--exclude", "*.pt", "--exclude", "*.bin", "--even", "4"], FLAGS)).toMatchObject({
      job: "b",
      json: true,
      steps: 2,
      host: 0,
      timeout: 500,
      staging: 2048,
      mode: "ignore",
      exclude: ["*.pt", "*.bin"],
      even: 4,
    });
  });

  it("refuses a bad value, a missing required flag, an unknown flag and a stray word, naming the flag", () => {
    expect(refusal([])).toBe("--job J is required: the job to end");
    expect(refusal(["--job", ""])).toBe("--job J is required: the job to end");
    expect(refusal(["--job", "a", "--steps", "1"])).toBe('--steps must be a whole number ≥ 2, got "1"');
    expect(refusal(["--job", "a", "--timeout", "0"])).toBe('--timeout must be a number from 0.1 to 2147483, got "0"');
    expect(refusal(["--job", "a", "--staging", "lots"])).toBe('--staging takes a size such as 4GiB or 1048576, got "lots"');
    expect(refusal(["--job", "a", "--mode", "all"])).toBe('--mode must be bounded or ignore, got "all"');
    expect(refusal(["--job", "a", "--even", "3"])).toBe('--even must be even, got "3"');
    expect(refusal(["--job", "a", "--colour"])).toMatch(/Unknown option '--colour'/);
    expect(refusal(["--job", "a", "extra"])).toMatch(/Unexpected argument 'extra'/);
  });

  it("yields the help: every flag in the usage and the options, required ones bare, defaults said once", () => {
    const help = helpText({ command: "monkeytree example", table: FLAGS, about: "Does an example.", after: "exit codes: 0 ok", tail: "-- CMD" });
    const [usage, about, options, after] = help.split("\n\n");
    expect(usage).toMatch(/^usage: monkeytree example --job J \[--json\] \[--snapshot FILE\]/);
    expect(usage).toMatch(/\[--exclude GLOB\]\.\.\.\s+\[--even N\]\s+-- CMD$/);
    for (const name of Object.keys(FLAGS)) expect(usage).toContain(`--${name}`);
    expect([about, after]).toEqual(["Does an example.", "exit codes: 0 ok"]);
    // Descriptions start two spaces past the longest spelling, `--mode bounded|ignore`.
    const option = (spelling: string, text: string) => `\n  ${spelling.padEnd(23)}${text}\n`;
    expect(options).toContain(option("--bind ADDR", "where to listen (default tcp://127.0.0.1:5555)"));
    expect(options).toContain(option("--staging SIZE", "staging for one checkpoint (default 1 KiB)"));
    expect(options).toContain(option("--mode bounded|ignore", "how comments count (default bounded)"));
    expect(options).toContain(option("--snapshot FILE", "the cluster snapshot"));
    expect(`${options}\n`).toContain(option("-h, --help", "show this help"));
  });

  it("wraps a long description beside its flag, never inside a `code span`", () => {
    const long = { slurm: str("FILE", `${"word ".repeat(30)}then \`monkeytree plan --snapshot FILE\` and more words to wrap`) };
    const lines = helpText({ command: "monkeytree x", table: long, about: "" }).split("\n");
    for (const line of lines) expect(line.length).toBeLessThanOrEqual(100);
    expect(lines.some((line) => line.includes("`monkeytree plan --snapshot FILE`"))).toBe(true);
    expect(lines.filter((line) => /^ {16}\S/.test(line)).length).toBeGreaterThan(1);
  });
});

describe("every command's help", () => {
  it("comes from its table: at most 100 columns, -h listed once", async () => {
    const { stdout } = await runCli("--help");
    const names = [...stdout.matchAll(/^ {2}([a-z]+) {2,}/gm)].map((m) => m[1]!);
    expect(names.length).toBeGreaterThan(10);
    for (const name of names) {
      const help = (await runCli(name, "--help")).stdout;
      const options = help.slice(help.indexOf("\noptions:\n"));
      expect(options.match(/-h, --help/g), name).toHaveLength(1);
      const wide = help.split("\n").filter((line) => line.length > 100 && !line.includes("/"));
      expect(wide, name).toEqual([]);
    }
  }, 120_000);
});
