// The converter's typed failures. Whose fault it was decides whether trying again can help: a guest fault (an
// unsupported system, a full file system, a repair that did not hold) fails the same way every time, an appliance
// or host fault (a hung or crashed launch, a full scratch disk) may pass on another attempt. `retryable` follows
// from the fault; the pipeline carries it into report.json and the job runner retries on it (services/worker/execute.ts).
import { OperationError } from '../../platform/errors';

export type ConverterFault = 'guest' | 'appliance' | 'host';

export class ConverterError extends OperationError {
  constructor(message: string, readonly fault: ConverterFault, readonly step?: string) {
    super(message, fault !== 'guest');
    this.name = 'ConverterError';
  }
}

/** A guest the converter's steps do not handle, refused by name before any step writes to it. */
export class UnsupportedGuest extends ConverterError {
  constructor(readonly guest: string, why: string) {
    super(`unsupported guest ${guest}: ${why}; nothing in the guest was changed`, 'guest', 'check_supported');
    this.name = 'UnsupportedGuest';
  }
}

/** A guest file system with too little room for the repair (the rule of domain/converter/prechecks.ts). */
export class GuestLowSpace extends ConverterError {
  constructor(message: string) {
    super(`${message}; nothing in the guest was changed`, 'guest', 'check_free_space');
    this.name = 'GuestLowSpace';
  }
}
