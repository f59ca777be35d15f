import { expect } from "vitest";
import { CheckpointError } from "../../sdk/contract/checkpoint/index.ts";

/** Runs `fn`, which must throw a CheckpointError, and returns the error. */
export function thrown(fn: () => unknown): CheckpointError {
  try {
    fn();
  } catch (error) {
    expect(error).toBeInstanceOf(CheckpointError);
    return error as CheckpointError;
  }
  throw new Error("expected a CheckpointError");
}
