// A graceful stop, as clusters ask for one: Slurm and Kubernetes send SIGTERM some seconds before they kill a job,
// a user presses Ctrl-C, ddprun forwards SIGUSR1. The first such signal only asks the program to stop at its next
// step boundary (a flag the training loop polls, and all ranks agree on, so that every rank ends after the same
// step and a checkpoint can be written); a second SIGTERM or SIGINT ends the process at once, as the signal
// itself would. SIGUSR1 only ever asks (it is how ddprun passes a stop on, perhaps after the user signalled the
// rank itself): a SIGUSR1 after a request changes nothing. Signals within 1 s of the first count as that first
// one (Slurm signals every process of a job at once, so a rank gets the same stop directly and through its
// launcher).
#pragma once

namespace ddp {

// The exit status of a program that stopped because it was asked to (sysexits' EX_TEMPFAIL: try again later).
// ddprun passes it on and does not restart such a job.
inline constexpr int kStoppedExitStatus = 75;
// The exit status of a program that was asked to stop and failed on the way (its checkpoint could not be
// written): run_main returns it for an error that ends a program after a stop was asked for. ddprun does not
// restart such a job either: a stop is never restarted.
inline constexpr int kStopFailedExitStatus = 76;
// The exit status of a program whose ranks agreed that its input is wrong (flags, data, a model that does not fit
// them: sysexits' EX_DATAERR): a retry would meet it again, so ddprun --max-restarts does not restart such a job.
inline constexpr int kInputErrorExitStatus = 65;

// Installs the handlers for SIGTERM, SIGINT and SIGUSR1 (once per process; later calls do nothing). Signals the
// process was started with ignored stay ignored (`nohup`).
void install_stop_handlers();

// True once a stop was asked for (by a signal or by request_stop). Async-signal-safe to read.
bool stop_requested();
// The signal that asked, or 0 (none yet, or request_stop).
int stop_signal();
// Asks for a stop as the first signal would (a program's own reasons; tests).
void request_stop();
// Forgets a stop that was asked for and honoured, for a program that goes on afterwards (another run in the same
// process; tests). A signal after it asks again, as the first one did.
void clear_stop_request();
// Notes that this process is stopping because the job was asked to (another rank's request, as
// Session::stop_requested learns it). Not a request of this process: a signal after it is still the first.
void note_stopping();
// A stop was asked of this process or noted: an error from here on ends it with kStopFailedExitStatus.
bool stopping();
// Seconds since the stop was asked for (0 when it was not): what a program reports as its time to stop.
double seconds_since_stop_request();

}  // namespace ddp
