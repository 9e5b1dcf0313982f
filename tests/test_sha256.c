/* test_sha256.c: src/util/sha256.c against the standard vectors (FIPS
 * 180-4 examples, NIST CAVS): "", "abc", the 448-bit message, the 896-bit
 * message and a million 'a' (fed in odd-sized pieces), and every split of
 * one update into two (so the block buffering is exercised at each fill).
 * A wrong digest must be told apart: a one-byte change of the input is
 * checked to change the digest. Run: make test, or build/tests/test_sha256.
 */
#include "util/sha256.h"
#include "t.h"

#include <string.h>

static void digest(const char *msg, size_t n, char hex[65]) {
    dhsa_sha256 s;
    dhsa_sha256_init(&s);
    dhsa_sha256_update(&s, msg, n);
    dhsa_sha256_final_hex(&s, hex);
}

int main(void) {
    static const struct {
        const char *msg, *want;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char hex[65];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        digest(v[i].msg, strlen(v[i].msg), hex);
        T_CHECK(strcmp(hex, v[i].want) == 0, "sha256(\"%.20s...\") = %s, want %s", v[i].msg, hex, v[i].want);
    }
    /* a million 'a', in pieces of 997 bytes (not a multiple of 64) */
    static char a[997];
    memset(a, 'a', sizeof a);
    dhsa_sha256 s;
    dhsa_sha256_init(&s);
    size_t left = 1000000;
    while (left) {
        size_t k = left < sizeof a ? left : sizeof a;
        dhsa_sha256_update(&s, a, k);
        left -= k;
    }
    dhsa_sha256_final_hex(&s, hex);
    T_CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0,
            "sha256(a x 1e6) = %s", hex);
    /* every split of the 896-bit message into two updates */
    const char *m = v[3].msg;
    size_t n = strlen(m);
    int bad = 0;
    for (size_t cut = 0; cut <= n; cut++) {
        dhsa_sha256_init(&s);
        dhsa_sha256_update(&s, m, cut);
        dhsa_sha256_update(&s, m + cut, n - cut);
        dhsa_sha256_final_hex(&s, hex);
        bad += strcmp(hex, v[3].want) != 0;
    }
    T_CHECK(bad == 0, "%d of %zu splits of one message give another digest", bad, n + 1);
    /* the check can fail: one byte changed, another digest */
    digest("abd", 3, hex);
    T_CHECK(strcmp(hex, v[1].want) != 0, "sha256(\"abd\") differs from sha256(\"abc\")");
    return t_report("test_sha256");
}
