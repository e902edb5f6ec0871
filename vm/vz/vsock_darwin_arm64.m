// A vsock connect that leaves the framework's descriptor to the framework.
//
// vz v3.7.1's VirtioSocketDevice.Connect wraps the connection's descriptor
// in an os.File, duplicates it and closes the original; the framework
// closes that original again when the connection object goes away. Between
// the two closes another file of vibedom's can take the number and be
// closed under it. Here the framework keeps its descriptor, vibedom gets a
// duplicate of its own, and the connection is closed through the framework
// (so its descriptor is closed once, by its owner).

#import <Foundation/Foundation.h>
#import <Virtualization/Virtualization.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// One connect shared by the waiter and the completion handler; the last of
// the two to let go frees it (and closes a descriptor nobody took).
typedef struct {
	atomic_int refs;
	int fd;
	long code;
	char *domain;
	char *err;
	dispatch_semaphore_t done;
} vibedomConnect;

static void vibedomConnectRelease(vibedomConnect *c) {
	if (atomic_fetch_sub(&c->refs, 1) != 1) {
		return;
	}
	if (c->fd >= 0) {
		close(c->fd);
	}
	free(c->err);
	free(c->domain);
	dispatch_release(c->done);
	free(c);
}

static char *vibedomStrdup(const char *s) { return strdup(s != NULL ? s : ""); }

// vibedomVsockConnect connects to port on the VZVirtioSocketDevice device,
// whose methods must be called on the dispatch queue queue. It returns a
// descriptor the caller owns, or -1 with *errOut (malloc'd, the caller frees
// it), *domainOut and *codeOut describing the failure. It gives up after
// timeoutMs; a connection that completes later is closed.
int vibedomVsockConnect(void *device, void *queue, uint32_t port, int64_t timeoutMs, char **errOut, char **domainOut, long *codeOut) {
	vibedomConnect *c = calloc(1, sizeof *c);
	if (c == NULL) {
		*errOut = vibedomStrdup("out of memory");
		return -1;
	}
	atomic_init(&c->refs, 2);
	c->fd = -1;
	c->done = dispatch_semaphore_create(0);
	dispatch_async((dispatch_queue_t)queue, ^{
		[(VZVirtioSocketDevice *)device connectToPort:port
			completionHandler:^(VZVirtioSocketConnection *conn, NSError *err) {
				if (err != nil) {
					c->err = vibedomStrdup([[err localizedDescription] UTF8String]);
					c->domain = vibedomStrdup([[err domain] UTF8String]);
					c->code = (long)[err code];
				} else {
					int fd = dup([conn fileDescriptor]);
					if (fd < 0) {
						c->err = vibedomStrdup(strerror(errno));
						c->code = errno;
						c->domain = vibedomStrdup("NSPOSIXErrorDomain");
					} else if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
						close(fd);
						c->err = vibedomStrdup(strerror(errno));
						c->code = errno;
						c->domain = vibedomStrdup("NSPOSIXErrorDomain");
					} else {
						c->fd = fd;
					}
					[conn close];
				}
				dispatch_semaphore_signal(c->done);
				vibedomConnectRelease(c);
			}];
	});
	int fd = -1;
	if (dispatch_semaphore_wait(c->done, dispatch_time(DISPATCH_TIME_NOW, timeoutMs * (int64_t)NSEC_PER_MSEC)) != 0) {
		*errOut = vibedomStrdup("the framework did not answer the vsock connect in time");
		*codeOut = ETIMEDOUT;
		*domainOut = vibedomStrdup("NSPOSIXErrorDomain");
	} else if (c->fd >= 0) {
		fd = c->fd;
		c->fd = -1;
	} else {
		*errOut = vibedomStrdup(c->err);
		*domainOut = vibedomStrdup(c->domain);
		*codeOut = c->code;
	}
	vibedomConnectRelease(c);
	return fd;
}
