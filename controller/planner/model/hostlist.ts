import { MAX_HOSTS } from "../../../sdk/contract/protocol/limits.ts";

/**
 * Slurm's hostlist syntax, as `topology.conf`, `scontrol` and `squeue` write it:
 * `n[0-3,7],gpu[01-02]` is n0 n1 n2 n3 n7 gpu01 gpu02. A range keeps its lower bound's zero
 * padding (`[08-10]` is 08 09 10); several brackets in one name multiply (`r[0-1]n[0-1]`).
 */

/** A hostlist that cannot be read; the message names the offending part. */
export class HostlistError extends Error {
  override readonly name = "HostlistError";
  readonly code = "invalid_hostlist";
  constructor(
    message: string,
    /** Whether the list is well formed but names more hosts than the limit. */
    readonly overLimit = false,
  ) {
    super(message);
  }
}

/** Names are what Slurm allows in NodeName: no spaces, commas or brackets. */
const NAME_PART = /^[A-Za-z0-9._-]*$/;

/**
 * The names `list` stands for, in its order. At most `limit` names (default: the most hosts
 * MonkeyTree supports), so a short hostile string cannot expand into millions.
 *
 * @throws HostlistError on unbalanced brackets, bad ranges, or more names than `limit`
 */
export function expandHostlist(list: string, limit = MAX_HOSTS): string[] {
  return expandHostlists([list], limit);
}

/**
 * The names of several hostlists, in order, at most `limit` of them in all: a file that
 * lists many hostlists (one per rack or switch) expands no further than one that lists one.
 *
 * @throws HostlistError as `expandHostlist`, the count being of all the lists together
 */
export function expandHostlists(lists: readonly string[], limit = MAX_HOSTS): string[] {
  const names: string[] = [];
  for (const list of lists) {
    for (const item of splitTopLevel(list.trim())) {
      for (const name of expandItem(item, list)) {
        names.push(name);
        if (names.length > limit)
          throw new HostlistError(
            `hostlist "${shorten(list)}" names more than ${limit} hosts${lists.length > 1 ? " with the lists before it" : ""}, the most MonkeyTree supports`,
            true,
          );
      }
    }
  }
  return names;
}

/** Commas outside brackets separate items. */
function splitTopLevel(list: string): string[] {
  if (list === "") return [];
  const items: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < list.length; i++) {
    const c = list[i];
    if (c === "[") depth++;
    else if (c === "]") depth--;
    if (depth < 0 || depth > 1) throw new HostlistError(`hostlist "${shorten(list)}" has unbalanced or nested brackets at character ${i + 1}`);
    if (c === "," && depth === 0) {
      items.push(list.slice(start, i));
      start = i + 1;
    }
  }
  if (depth !== 0) throw new HostlistError(`hostlist "${shorten(list)}" has an unclosed "["`);
  items.push(list.slice(start));
  for (const item of items) if (item === "") throw new HostlistError(`hostlist "${shorten(list)}" has an empty item; remove the extra comma`);
  return items;
}

/** One item: literal parts and bracketed range sets, multiplied left to right. */
function* expandItem(item: string, list: string): Generator<string> {
  const open = item.indexOf("[");
  if (open < 0) {
    yield literal(item, list);
    return;
  }
  const close = item.indexOf("]", open);
  const prefix = literal(item.slice(0, open), list);
  const values = rangeSet(item.slice(open + 1, close), list);
  const rest = item.slice(close + 1);
  for (const value of values) for (const tail of expandItem(rest, list)) yield `${prefix}${value}${tail}`;
}

function literal(part: string, list: string): string {
  if (!NAME_PART.test(part)) throw new HostlistError(`hostlist "${shorten(list)}": "${shorten(part)}" is not a host name (letters, digits, ".", "_", "-")`);
  return part;
}

/** `0-3,7` → 0 1 2 3 7, each as wide as its range's lower bound is written. */
function rangeSet(body: string, list: string): string[] {
  const out: string[] = [];
  for (const range of body.split(",")) {
    const match = /^(\d+)(?:-(\d+))?$/.exec(range);
    if (!match) throw new HostlistError(`hostlist "${shorten(list)}": "[${shorten(body)}]" must hold numbers and ranges such as 0-3,7`);
    const [, lowText = "", highText] = match;
    const low = Number(lowText);
    const high = highText === undefined ? low : Number(highText);
    // Past 2^53 a number no longer counts up by one: `v++` would never reach `high`.
    if (!Number.isSafeInteger(high))
      throw new HostlistError(
        `hostlist "${shorten(list)}": range ${shorten(range)} has a bound over ${Number.MAX_SAFE_INTEGER}; host numbers are decimal and at most that`,
      );
    if (high < low) throw new HostlistError(`hostlist "${shorten(list)}": range ${range} runs backwards`);
    if (high - low >= MAX_HOSTS)
      throw new HostlistError(`hostlist "${shorten(list)}": range ${range} names more than ${MAX_HOSTS} hosts, the most MonkeyTree supports`);
    for (let v = low; v <= high; v++) out.push(String(v).padStart(lowText.length, "0"));
    if (out.length > MAX_HOSTS)
      throw new HostlistError(`hostlist "${shorten(list)}": "[${shorten(body)}]" names more than ${MAX_HOSTS} hosts, the most MonkeyTree supports`);
  }
  return out;
}

const shorten = (text: string): string => (text.length > 60 ? `${text.slice(0, 57)}...` : text);
