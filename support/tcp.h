// tcp.h: the sockets under a launch without MPI (docs/sharding.md: the
// torchrun-style environment). Listening, connecting with retries until a
// deadline, accepting with a deadline, and sending or receiving a whole buffer
// through signals and short transfers. fsdp.h builds its rendezvous and its host
// collectives on these. POSIX sockets, IPv4 and IPv6.
//
// Every function returns 0 on success and -1 on failure, with the reason in
// err (errn bytes); none of them exits, so the caller names the rank and what it
// was doing. Sends use MSG_NOSIGNAL: a peer that has gone away is an error
// return here, not a SIGPIPE that would end the process without a word.
#ifndef TCP_H
#define TCP_H
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static inline double tcp__now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// small messages (headers, flags) go out at once rather than waiting for more
static inline void tcp__nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// the stream sockets of host:port, IPv4 or IPv6 (host NULL: every interface, to
// listen on); getaddrinfo's result
static inline int tcp__resolve(const char *host, int port, struct addrinfo **res) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = host ? 0 : AI_PASSIVE;
    return getaddrinfo(host, service, &hints, res);
}

// Listens on every interface at port (0: a free one the system picks); *fd is
// the listening socket and *bound its port.
static inline int tcp_listen(int port, int *fd, int *bound, char *err, size_t errn) {
    struct addrinfo *res;
    int rc = tcp__resolve(NULL, port, &res);
    if (rc != 0) {
        snprintf(err, errn, "cannot listen on port %d: %s", port, gai_strerror(rc));
        return -1;
    }
    int last = 0;
    *fd = -1;
    for (struct addrinfo *a = res; a && *fd < 0; a = a->ai_next) { // IPv6 (serving IPv4 too) where the host has it
        int s = socket(a->ai_family, a->ai_socktype, a->ai_protocol), one = 1;
        if (s < 0) { last = errno; continue; }
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); // a port of a run that just ended is free again
        if (bind(s, a->ai_addr, a->ai_addrlen) == 0 && listen(s, 128) == 0) *fd = s;
        else last = errno, close(s);
    }
    freeaddrinfo(res);
    if (*fd < 0) {
        snprintf(err, errn, "cannot listen on port %d: %s", port, strerror(last));
        return -1;
    }
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    getsockname(*fd, (struct sockaddr *)&sa, &len);
    *bound = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port);
    return 0;
}

// Connects to host:port, trying again every 100 ms until deadline (tcp__now()
// seconds): the peer may not be listening yet. A host that does not resolve is
// an error at once.
static inline int tcp_connect(const char *host, int port, double deadline, int *fd, char *err, size_t errn) {
    struct addrinfo *res;
    for (;;) {
        int rc = tcp__resolve(host, port, &res), last = 0;
        if (rc != 0 && rc != EAI_AGAIN) {
            snprintf(err, errn, "cannot resolve '%s': %s", host, gai_strerror(rc));
            return -1;
        }
        for (struct addrinfo *a = rc == 0 ? res : NULL; a; a = a->ai_next) {
            int s = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (s < 0) { last = errno; continue; }
            if (connect(s, a->ai_addr, a->ai_addrlen) == 0) {
                freeaddrinfo(res);
                tcp__nodelay(s);
                *fd = s;
                return 0;
            }
            last = errno;
            close(s);
        }
        if (rc == 0) freeaddrinfo(res);
        if (tcp__now() > deadline) {
            snprintf(err, errn, "cannot connect to %s:%d: %s", host, port, rc ? gai_strerror(rc) : strerror(last));
            return -1;
        }
        struct timespec wait = {0, 100 * 1000 * 1000};
        nanosleep(&wait, NULL);
    }
}

// Waits until deadline for fd to become readable (a connection to accept, or data)
static inline int tcp__wait(int fd, double deadline, const char *what, char *err, size_t errn) {
    for (;;) {
        double left = deadline - tcp__now();
        if (left <= 0) {
            snprintf(err, errn, "timed out waiting for %s", what);
            return -1;
        }
        struct pollfd p = {fd, POLLIN, 0};
        int rc = poll(&p, 1, left > 1e6 ? 1000000000 : (int)(left * 1000) + 1);
        if (rc > 0) return 0;
        if (rc < 0 && errno != EINTR) {
            snprintf(err, errn, "waiting for %s: %s", what, strerror(errno));
            return -1;
        }
    }
}

// Accepts a connection on the listening socket lfd, waiting until deadline; host
// (hostn bytes) receives the peer's numeric address
static inline int tcp_accept(int lfd, double deadline, int *fd, char *host, size_t hostn, char *err, size_t errn) {
    for (;;) {
        if (tcp__wait(lfd, deadline, "a connection", err, errn) != 0) return -1;
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        int s = accept(lfd, (struct sockaddr *)&sa, &len);
        if (s < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
            snprintf(err, errn, "accept: %s", strerror(errno));
            return -1;
        }
        if (getnameinfo((struct sockaddr *)&sa, len, host, (socklen_t)hostn, NULL, 0, NI_NUMERICHOST) != 0)
            snprintf(host, hostn, "?");
        tcp__nodelay(s);
        *fd = s;
        return 0;
    }
}

// sends all n bytes of buf
static inline int tcp_send(int fd, const void *buf, size_t n, char *err, size_t errn) {
    const char *p = (const char *)buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            snprintf(err, errn, "send: %s", k < 0 ? strerror(errno) : "no progress");
            return -1;
        }
        p += k, n -= (size_t)k;
    }
    return 0;
}

// receives exactly n bytes into buf; the peer closing the connection first is a failure
// ("the connection closed"), and so is nothing arriving by deadline (0: no deadline)
static inline int tcp_recv(int fd, void *buf, size_t n, double deadline, char *err, size_t errn) {
    char *p = (char *)buf;
    while (n > 0) {
        if (deadline > 0 && tcp__wait(fd, deadline, "data", err, errn) != 0) return -1;
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            snprintf(err, errn, "%s", k == 0 ? "the connection closed" : strerror(errno));
            return -1;
        }
        p += k, n -= (size_t)k;
    }
    return 0;
}

#endif // TCP_H
