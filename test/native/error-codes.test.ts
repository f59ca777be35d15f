import { readdirSync, readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { transferErrorCodes } from "../../native/index.ts";

/**
 * The native layer's error codes are declared once, in `transferErrorCodes`: a code the C++
 * raises that the table lacks would reach JavaScript as `io`, and one the table lists that
 * nothing raises is dead. This reads every code out of the C++ sources (a `Failure` literal
 * `{"code", …}`, or `ThrowTransferError`/`MakeTransferError(env, "code", …)`) and holds the two
 * to each other.
 */
function raisedCodes(): Set<string> {
  const dir = new URL("../../native/src/", import.meta.url);
  const sources = readdirSync(dir).filter((name) => /\.(cpp|hpp)$/.test(name));
  const codes = new Set<string>();
  for (const name of sources) {
    const text = readFileSync(new URL(name, dir), "utf8");
    for (const match of text.matchAll(/\{"([a-z_]+)",|TransferError\(env, "([a-z_]+)"/g)) codes.add(match[1] ?? match[2]!);
  }
  return codes;
}

describe("native error codes", () => {
  it("are the ones TransferError knows, each raised somewhere", () => {
    expect([...raisedCodes()].sort()).toEqual([...transferErrorCodes].sort());
  });
});
