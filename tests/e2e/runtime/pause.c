/* The pod sandbox's process: sleep until told to stop. PID 1 ignores signals without a handler, so
 * TERM and INT get one that exits; children (none expected) are reaped. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, 0, WNOHANG) > 0) {} }

int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
