import { expect } from "vitest";
import { TransferError } from "../../native/index.ts";

/** Awaits a promise that must reject with a `TransferError`, and returns the error. */
export async function rejection(promise: Promise<unknown>): Promise<TransferError> {
  try {
    await promise;
  } catch (error) {
    expect(error).toBeInstanceOf(TransferError);
    return error as TransferError;
  }
  throw new Error("expected a rejection");
}
