// dev/emu/mpi_leaks.h: LeakSanitizer beside MPI, compiled into the emulated programs
// built with both (-DUSE_MPI and ASan: the emulated trainer, dev/cuda/fsdp_nccl,
// test/emu_planted/mpi_leak), so that a correct run exits 0 with no ASAN_OPTIONS or
// LSAN_OPTIONS set, as a user runs it: OpenMPI keeps what MPI_Init, MPI_Finalize and its
// progress threads allocate until the process exits, and LSan would report it.
//
// - Suppressed: a leak whose allocation stack has a frame in one of MPI's own shared
//   objects (matched by the object's path, so no frame need be symbolized). Our code
//   never runs below an MPI frame (it gives MPI no callbacks), so a leak of ours has
//   none and is still reported (test_emu_checkers.sh plants one beside MPI's).
//   Memory MPI allocates for us and we never release (a communicator left unfreed)
//   is MPI's, and suppressed with it.
// - fast_unwind_on_malloc=0: the frame-pointer unwinder stops in code built without
//   frame pointers (libc's vasprintf, called by OpenMPI), short of MPI's frames.
//   Its cost (4-step LoRA run on tiny_gqa): 2.04 -> 2.21 s alone, 1.83 -> 2.48 s a
//   rank under mpirun -np 2 (MPI_Init's thousands of allocations).
// - dlclose does nothing: OpenMPI unloads its components (mca_*.so) in MPI_Finalize,
//   and LSan re-reads /proc/self/maps (long here: a mapping per device allocation)
//   for every frame in an unloaded object; loaded, their globals still point to most
//   of what they allocated. The leak check then takes 0.07 s a rank instead of 1.5.
//   Our code never calls dlclose; a library that does keeps the object mapped, harmless.
// - print_suppressions=0: no table of the suppressed leaks after every clean run.
// ASAN_OPTIONS and LSAN_OPTIONS still override or add to all of it.
#pragma once
#if defined(USE_MPI) && (defined(__SANITIZE_ADDRESS__) || (defined(__has_feature) && __has_feature(address_sanitizer)))
#include <dlfcn.h>

// (each emulated program is one translation unit; weak all the same, as the runtime's own are)
extern "C" __attribute__((weak, used)) const char *__lsan_default_suppressions() {
    return "leak:libmpi.so\n"        // OpenMPI (Open MPI 4: libmpi.so.40)
           "leak:libopen-pal.so\n"   // OpenMPI's portability layer (the components' loader)
           "leak:libopen-rte.so\n"   // OpenMPI's runtime (its launch and wire-up)
           "leak:/openmpi/\n"        // OpenMPI's components: <libdir>/openmpi/lib/openmpi3/mca_*.so
           "leak:libpmix.so\n"       // PMIx, which wires the ranks up, and its components
           "leak:/pmix\n"            //   (<libdir>/pmix2/lib/pmix/mca_*.so)
           "leak:libevent\n"         // libevent, the loop of OpenMPI's and PMIx's progress threads
           "leak:libhwloc.so\n"      // hwloc, the topology OpenMPI binds ranks by
           "leak:libmpich.so\n";     // MPICH, where mpicc is MPICH's
}

extern "C" __attribute__((weak, used)) const char *__asan_default_options() {
    return "fast_unwind_on_malloc=0:print_suppressions=0";
}

extern "C" __attribute__((weak, used)) int dlclose(void *) noexcept { return 0; }
#endif
