#!/usr/bin/env perl
# dev/emu/rewrite.pl SRC OUT: the one source rewrite of the emulated build.
#
# The host C++ compiler takes the CUDA sources unchanged except for two pieces of
# syntax that no macro can express; this script rewrites those and nothing else,
# and keeps every line where it was (OUT starts with `#line 1 "SRC"`, so that
# compiler errors, sanitizer reports and __FILE__/__LINE__ name the original):
#
#   kernel<<<grid, block, smem, stream>>>(args)
#     -> ::emu::launch(<kernel as a pointer>, <kernel as a call>, "kernel", __FILE__, __LINE__,
#                      grid, block, smem, stream)(args)
#     (kernel: a name, a name<template, args> or a variable holding a kernel; a
#     template whose arguments the call deduces is launched as a call, device.h;
#     the configuration and the arguments may span lines)
#   __shared__ T a[N][M], b[K];        (in a kernel or a __device__ function)
#     -> static char key1; T (&a)[N][M] = ::emu::shared_variable<T[N][M]>(&key1); (and b)
#     (one variable per block and declaration, device.h)
#   extern __shared__ __align__(16) T s[];
#     -> T *const s = ::emu::dynamic_shared<T>();   (the launch's dynamic shared memory)
#
# Comments, strings and character literals are left alone. Anything that looks
# like either syntax and does not parse stops the build with the file and line.
use strict;
use warnings;

my ($src, $out) = @ARGV;
die "usage: rewrite.pl SRC OUT\n" unless defined $out;
open(my $in, '<', $src) or die "rewrite.pl: cannot read $src: $!\n";
my $text = do { local $/; <$in> };
close $in;

# comments and literals become placeholders \x01N\x01 (and a \x02 before each of
# their newlines), so the patterns below see code only
my @kept;
$text =~ s{(//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')}{
    push @kept, $1;
    "\x01" . $#kept . "\x01" . ("\x02\n" x ($1 =~ tr/\n//))
}gse;

sub line_at { my ($pos) = @_; return 1 + (substr($text, 0, $pos) =~ tr/\n//); }
sub fail_at { my ($pos, $what) = @_; die "$src:" . line_at($pos) . ": rewrite.pl: $what\n"; }
sub newlines { my ($s) = @_; return "\n" x ($s =~ tr/\n//); } # of a rewritten piece, kept after it

# launches
my $name = qr{(?:::)?\w+(?:::\w+)*};
my $targs = qr{<(?:[^<>;(){}]|<[^<>;(){}]*>)*>};
$text =~ s{($name(?:\s*$targs)?)\s*<<<(.*?)>>>(\s*)\(}{
    my ($kernel, $config, $ws) = ($1, $2, $3);
    (my $quoted = $kernel) =~ s/\s+/ /g;
    "::emu::launch([=](auto emu_t) -> decltype(::emu::kernel_pointer(emu_t, $kernel)) { return ::emu::kernel_pointer(emu_t, $kernel); }, "
        . "[=](const auto &...emu_a) { $kernel(emu_a...); }, \"$quoted\", __FILE__, __LINE__, $config)$ws("
}gse;
fail_at($-[0], "a <<<...>>> launch it cannot parse (kernel<<<grid, block[, smem[, stream]]>>>(args))")
    if $text =~ /<<<|>>>\s*\(/;

# dynamic shared memory
$text =~ s{\bextern\s+__shared__\b([^;]*);}{
    my ($decl, $at) = ($1, $-[0]);
    (my $d = $decl) =~ s/__align__\s*\(\s*\d+\s*\)//g;
    fail_at($at, "an extern __shared__ declaration it cannot parse (extern __shared__ T name[];)")
        unless $d =~ /^\s*(.*?)\s*\b(\w+)\s*\[\s*\]\s*$/s && $1 ne '';
    "$1 *const $2 = ::emu::dynamic_shared<$1>();" . newlines($decl)
}gse;

# static shared memory
my $key = 0;
$text =~ s{\b__shared__\b([^;]*);}{
    my ($decl, $at) = ($1, $-[0]);
    my ($type, @vars);
    for my $part (split /,(?![^\[]*\])/, $decl) { # declarators: commas outside [...]
        my $re = defined $type ? qr/^\s*()(\w+)\s*((?:\[[^\]]*\]\s*)*)$/s : qr/^\s*(.*?)\s*\b(\w+)\s*((?:\[[^\]]*\]\s*)*)$/s;
        fail_at($at, "a __shared__ declaration it cannot parse (__shared__ T name[N]...;)") unless $part =~ $re;
        my ($t, $var, $dims) = ($1, $2, $3);
        $type = $t unless defined $type;
        fail_at($at, "a __shared__ declaration without a type") if $type eq '';
        s/\s+/ /g for $type, $dims; # one line: newlines() puts the declaration's back after it
        $dims =~ s/ $//;
        $key++;
        push @vars, "static char emu_shared_key$key; $type (&$var)$dims = ::emu::shared_variable<$type$dims>(&emu_shared_key$key);";
    }
    join(' ', @vars) . newlines($decl)
}gse;

$text =~ s{\x01(\d+)\x01(?:\x02\n)*}{$kept[$1]}g;
open(my $o, '>', $out) or die "rewrite.pl: cannot write $out: $!\n";
print $o "#line 1 \"$src\"\n", $text;
close $o or die "rewrite.pl: cannot write $out: $!\n";
