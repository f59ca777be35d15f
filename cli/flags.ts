import { parseArgs } from "node:util";
import { byteSize, intFlag, numberFlag, secondsFlag, UsageError } from "./io.ts";

/**
 * A command's flags, declared once: each entry says how the flag is spelled in help, what it
 * means, its default, and how its text becomes a checked value. The parser's options, the
 * validation and the help's usage and options sections all come from the same table, so a
 * flag cannot be parsed without being documented, or documented with another default.
 */

/** What `parseArgs` hands a flag: its text, its texts when repeatable, true for a switch, undefined when absent. */
type Raw = string | string[] | boolean | undefined;

export interface Flag<T> {
  /** How `parseArgs` reads it. */
  readonly kind: "string" | "strings" | "boolean";
  /** What its value is called in help (FILE, S, N); none for a switch. */
  readonly arg?: string;
  /** What it does, one paragraph; help wraps it. */
  readonly help: string;
  /** The default as help shows it, appended as "(default …)"; none when absent means unset or the help says it. */
  readonly default?: string;
  /** Whether usage shows it without brackets. */
  readonly required?: boolean;
  /** The value from what was given; throws `UsageError` naming `--name` and what it takes. */
  readonly parse: (raw: Raw, name: string) => T;
}

export type FlagTable = Readonly<Record<string, Flag<unknown>>>;

/** The checked values of a table's flags, by name. */
export type FlagValues<T extends FlagTable> = { -readonly [K in keyof T]: T[K] extends Flag<infer V> ? V : never };

const text = (raw: Raw): string | undefined => (typeof raw === "string" ? raw : undefined);

/** A switch such as `--json`: true when given. */
export function bool(help: string): Flag<boolean> {
  return { kind: "boolean", help, parse: (raw) => raw === true };
}

/** A text flag, undefined when absent; with `default`, that instead. */
export function str(arg: string, help: string): Flag<string | undefined>;
export function str(arg: string, help: string, options: { default: string; show?: string }): Flag<string>;
export function str(arg: string, help: string, options?: { default: string; show?: string }): Flag<string | undefined> {
  return valued(arg, help, (value) => value, options?.default, options?.show ?? options?.default);
}

/** A text flag that must be given and not empty; `what` says what it is, for the error. */
export function required(arg: string, help: string, what: string): Flag<string> {
  return {
    kind: "string",
    arg,
    help,
    required: true,
    parse: (raw, name) => {
      const value = text(raw);
      if (value === undefined || value === "") throw new UsageError(`--${name} ${arg} is required: ${what}`);
      return value;
    },
  };
}

/** A repeatable text flag (`--per-source A --per-source B`), in the order given. */
export function list(arg: string, help: string): Flag<string[]> {
  return { kind: "strings", arg, help, parse: (raw) => (Array.isArray(raw) ? raw : []) };
}

interface Range {
  readonly min: number;
  readonly max?: number;
}

/** A text flag whose value is `check`ed, else `fallback` when absent, which help shows as `show`. */
function valued<T>(arg: string, help: string, check: (value: string, name: string) => T, fallback: T, show: string | number | undefined): Flag<T> {
  return {
    kind: "string",
    arg,
    help,
    ...(show === undefined ? {} : { default: String(show) }),
    parse: (raw, name) => {
      const value = text(raw);
      return value === undefined ? fallback : check(value, name);
    },
  };
}

/** A whole number from `min` (to `max`); undefined when absent unless it has a `default`. */
export function int(arg: string, help: string, range: Range & { default: number; show?: string }): Flag<number>;
export function int(arg: string, help: string, range: Range): Flag<number | undefined>;
export function int(arg: string, help: string, range: Range & { default?: number; show?: string }): Flag<number | undefined> {
  return valued(arg, help, (value, name) => intFlag(name, value, undefined, range.min, range.max), range.default, range.show ?? range.default);
}

/** A number from `min` (to `max`), such as `--ep-factor 2.5`. */
export function num(arg: string, help: string, range: Range & { default: number; show?: string }): Flag<number> {
  return valued(arg, help, (value, name) => numberFlag(name, value, range.default, range.min, range.max), range.default, range.show ?? range.default);
}

/** A duration given in seconds, at least `min`, returned in milliseconds. */
export function seconds(arg: string, help: string, range: { min: number; default: number; show?: string }): Flag<number> {
  return valued(arg, help, (value, name) => secondsFlag(name, value, range.default, range.min), range.default * 1000, range.show ?? range.default);
}

/** A size such as 4GiB or 1048576 bytes. */
export function size(arg: string, help: string, options: { default: number; show?: string }): Flag<number> {
  return valued(arg, help, (value, name) => byteSize(name, value), options.default, options.show ?? options.default);
}

/** One of `values`; `fallback` when absent. */
export function choice<const V extends string>(values: readonly V[], help: string, fallback: V): Flag<V>;
export function choice<const V extends string>(values: readonly V[], help: string): Flag<V | undefined>;
export function choice<const V extends string>(values: readonly V[], help: string, fallback?: V): Flag<V | undefined> {
  const pick = (value: string, name: string): V => {
    const found = values.find((v) => v === value);
    if (found === undefined) throw new UsageError(`--${name} must be ${oneOf(values)}, got "${value}"`);
    return found;
  };
  return valued<V | undefined>(values.join("|"), help, pick, fallback, fallback);
}

/** A text flag checked by `check`, which throws `UsageError` or returns the value; undefined when absent. */
export function checked<T>(arg: string, help: string, check: (value: string, name: string) => T): Flag<T | undefined>;
export function checked<T>(arg: string, help: string, check: (value: string, name: string) => T, fallback: { default: string; show?: string }): Flag<T>;
export function checked<T>(
  arg: string,
  help: string,
  check: (value: string, name: string) => T,
  fallback?: { default: string; show?: string },
): Flag<T | undefined> {
  return {
    kind: "string",
    arg,
    help,
    ...(fallback === undefined ? {} : { default: fallback.show ?? fallback.default }),
    parse: (raw, name) => {
      const value = text(raw) ?? fallback?.default;
      return value === undefined ? undefined : check(value, name);
    },
  };
}

const oneOf = (values: readonly string[]): string => (values.length <= 2 ? values.join(" or ") : `one of ${values.join(", ")}`);

/** `parseArgs`'s options for `table`, for a command that reads its tokens too (the order flags were given in). */
export function parseArgsOptions(table: FlagTable): Record<string, { type: "string" | "boolean"; multiple: boolean }> {
  return Object.fromEntries(
    Object.entries(table).map(([name, flag]) => [name, { type: flag.kind === "boolean" ? "boolean" : "string", multiple: flag.kind === "strings" }]),
  );
}

/** Parses `argv` by `table`: unknown flags, stray positionals and bad values are `UsageError`s naming the flag. */
export function parseCommandFlags<T extends FlagTable>(argv: readonly string[], table: T): FlagValues<T> {
  let values: Record<string, Raw>;
  try {
    values = parseArgs({ args: [...argv], options: parseArgsOptions(table), allowPositionals: false, strict: true }).values as Record<string, Raw>;
  } catch (error) {
    throw new UsageError(error instanceof Error ? error.message : String(error));
  }
  return Object.fromEntries(Object.entries(table).map(([name, flag]) => [name, flag.parse(values[name], name)])) as FlagValues<T>;
}

/**
 * The options of a program started on its own rather than as a `monkeytree` command (a
 * benchmark, the demo's worker): undefined, with the exit code set, when `--help` or `-h` asked
 * for `help` (0) or `parse` refused the command line (2, with the reason and the usage on stderr).
 */
export function programOptions<T>(name: string, help: string, parse: (argv: string[]) => T, argv = process.argv.slice(2)): T | undefined {
  if (argv.includes("--help") || argv.includes("-h")) {
    process.stdout.write(`${help}\n`);
    return undefined;
  }
  try {
    return parse(argv);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    process.stderr.write(`${name}: ${error.message}\n${help}\n`);
    process.exitCode = 2;
    return undefined;
  }
}

/** Widest help line, and the longest option spelling its description starts beside; longer ones get a line of their own. */
const WIDTH = 100;
const MAX_NAME = 24;

const spelled = (name: string, flag: Flag<unknown>): string => `--${name}${flag.arg === undefined ? "" : ` ${flag.arg}`}`;

/** `words` as lines of at most `width` characters, the first after `first`, the rest after `indent`. */
function wrap(words: readonly string[], first: string, indent: string, width = WIDTH): string[] {
  const lines: string[] = [];
  let line = first;
  let empty = true;
  for (const word of words) {
    if (!empty && line.length + 1 + word.length > width) {
      lines.push(line);
      line = indent;
      empty = true;
    }
    line += empty ? word : ` ${word}`;
    empty = false;
  }
  lines.push(line);
  return lines;
}

/** The words of `text`, a `code span` with what follows it kept whole so no line breaks inside it. */
const wordsOf = (text: string): string[] => text.replace(/\s+/g, " ").match(/`[^`]*`\S*|\S+/g) ?? [];

/** The usage line: `usage: monkeytree CMD --needed X [--optional Y] [--repeatable Z]...`, wrapped under its first flag. */
function usageLine(command: string, table: FlagTable, tail = ""): string {
  const head = `usage: ${command} `;
  const parts = Object.entries(table).map(([name, flag]) => {
    const part = flag.required ? spelled(name, flag) : `[${spelled(name, flag)}]`;
    return flag.kind === "strings" ? `${part}...` : part;
  });
  if (tail !== "") parts.push(tail);
  return wrap(parts, head, " ".repeat(head.length)).join("\n");
}

/** The options section: each flag, its description wrapped beside it, its default; then -h. */
function optionsSection(table: FlagTable): string {
  const names = Object.entries(table).map(([name, flag]) => spelled(name, flag));
  const column = 2 + Math.max(...names.map((n) => n.length).filter((n) => n <= MAX_NAME), "-h, --help".length) + 2;
  const indent = " ".repeat(column);
  const lines = Object.values(table).flatMap((flag, i) => {
    const name = `  ${names[i]}`;
    const words = wordsOf(`${flag.help}${flag.default === undefined ? "" : ` (default ${flag.default})`}`);
    return name.length + 2 > column ? [name, ...wrap(words, indent, indent)] : wrap(words, name.padEnd(column), indent);
  });
  return ["options:", ...lines, `${"  -h, --help".padEnd(column)}show this help`].join("\n");
}

/** A command's whole help: usage, what it does, its options, then what follows (exit codes, notes). */
export function helpText(parts: { command: string; table: FlagTable; about: string; after?: string; tail?: string }): string {
  return [usageLine(parts.command, parts.table, parts.tail), parts.about, optionsSection(parts.table), ...(parts.after ? [parts.after] : [])].join("\n\n");
}
