import { readFileSync } from "node:fs";
import type { z } from "zod";

/** One problem in an input document, located by its path. */
export interface InputIssue {
  /** Where, as `jobs[3].hosts[2]`; empty for the document itself. */
  readonly path: string;
  readonly message: string;
}

/**
 * The one place zod issues become text: `SOURCE at PATH: MESSAGE (and N more)`, naming the
 * first issue. Sites that throw their own error class (a protocol error, a channel reply)
 * take the text from here.
 */
export function formatZodError(source: string, error: z.ZodError): string {
  return render(source, error.issues.map(toIssue));
}

/** A document (snapshot, config, message) that does not match its schema. */
export class InvalidInputError extends Error {
  override readonly name = "InvalidInputError";
  readonly code = "invalid_input";
  constructor(
    /** What was being read, as `snapshot cluster.json`. */
    readonly source: string,
    readonly issues: readonly InputIssue[],
  ) {
    super(render(source, issues));
  }

  static fromZod(source: string, error: z.ZodError): InvalidInputError {
    return new InvalidInputError(source, error.issues.map(toIssue));
  }
}

/** One line: the first issue, and how many more there are. */
function render(source: string, issues: readonly InputIssue[]): string {
  const first = issues[0];
  if (!first) return `${source}: invalid`;
  const where = first.path ? `${source} at ${first.path}` : source;
  const more = issues.length > 1 ? ` (and ${issues.length - 1} more)` : "";
  return `${where}: ${first.message}${more}`;
}

/** Unknown keys named in one message; input can carry any number of them. */
const KEYS_SHOWN = 3;

function toIssue(issue: z.core.$ZodIssue): InputIssue {
  const path = formatPath(issue.path);
  if (issue.code === "unrecognized_keys") {
    const shown = issue.keys.slice(0, KEYS_SHOWN).map((k) => quote(k)).join(", ");
    const keys = issue.keys.length > KEYS_SHOWN ? `${shown} and ${issue.keys.length - KEYS_SHOWN} more` : shown;
    return { path, message: `unknown field ${keys}; remove it or check its spelling` };
  }
  return { path, message: issue.message };
}

export function formatPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const key of path) {
    if (typeof key === "number") out += `[${key}]`;
    else out += out ? `.${String(key)}` : String(key);
  }
  return out;
}

/**
 * A JSON file checked against `schema`; every failure is an `InvalidInputError` naming
 * `source`, and one that cannot be read says `hint` (how to make the file).
 */
export function readJsonFile<T>(path: string, source: string, schema: z.ZodType<T>, hint: string): T {
  let value: unknown;
  try {
    value = JSON.parse(readFileSync(path, "utf8"));
  } catch (error) {
    const reason = (error as NodeJS.ErrnoException).code === "ENOENT" ? "no such file" : (error as Error).message;
    throw new InvalidInputError(source, [{ path: "", message: `cannot read it (${reason}); ${hint}` }]);
  }
  const result = schema.safeParse(value);
  if (!result.success) throw InvalidInputError.fromZod(source, result.error);
  return result.data;
}

/**
 * Untrusted text as it may appear in a reply or a log line: at most `max` characters of it,
 * quoted with control characters escaped, and how long the whole was when it was cut.
 */
export function quote(value: string, max = 64): string {
  const shown = JSON.stringify(value.length > max ? value.slice(0, max) : value);
  return value.length > max ? `${shown}… (${value.length} characters)` : shown;
}
