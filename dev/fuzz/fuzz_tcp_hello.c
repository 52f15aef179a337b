// The hellos rank 0 receives while the ranks of a launch by environment connect
// (fsdp.h's TCP backend): whatever bytes arrive on the rendezvous port. The
// first two bytes choose the communicator (its size 2-9, the world's
// rendezvous or a split's), the rest is read as 24-byte hellos in a row, as
// from successive connections, each judged by fsdp__hello_problem against the
// ranks that arrived before it.
// Properties: a hello that is accepted names a rank in [1, size) that has not
// arrived yet and (a split) the world rank expected there; the world's port is
// a real port; a rejected hello is given a reason; a rank never arrives twice.
#include "../../fsdp.h"
#include "fuzz.h"

FUZZ_TARGET(tcp_hello) {
    if (size < 2) return 0;
    FsdpComm c;
    memset(&c, 0, sizeof c);
    c.size = 2 + data[0] % 8;
    uint32_t kind = data[1] & 1 ? FSDP__HELLO_SPLIT : FSDP__HELLO_WORLD, tag = kind == FSDP__HELLO_WORLD ? (uint32_t)c.size : 3;
    int fd[9], want[9];
    for (int r = 0; r < c.size; r++) fd[r] = -1, want[r] = 7 * r + 1; // the world ranks a split expects
    c.fd = fd;
    for (size_t off = 2; off + 24 <= size; off += 24) {
        uint32_t w[6], h[6];
        memcpy(w, data + off, sizeof w);
        fsdp__get(h, w, 6);
        const char *bad = fsdp__hello_problem(h, kind, tag, &c, want);
        if (bad) {
            FUZZ_ASSERT(bad[0] != '\0');
            continue;
        }
        FUZZ_ASSERT(h[0] == FSDP_TCP_MAGIC && h[1] == FSDP_TCP_VERSION && h[2] == kind && h[3] == tag);
        FUZZ_ASSERT(h[4] >= 1 && h[4] < (uint32_t)c.size && fd[h[4]] < 0);
        FUZZ_ASSERT(kind == FSDP__HELLO_WORLD ? h[5] >= 1 && h[5] <= 65535 : h[5] == (uint32_t)want[h[4]]);
        fd[h[4]] = 1;
    }
    return 0;
}
