"""reslm.core.native: a package C source compiled here once, cached by what it was built from, and None
(with the reason) where it cannot be built, so callers fall back to their torch path."""
import ctypes

import pytest

from reslm.core import native

SOURCE = "int reslm_twice(int x) { return 2 * x * SCALE; }\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RESLM_CACHE", str(tmp_path / "cache"))
    native.build.cache_clear()
    yield tmp_path / "cache" / "kernels"
    native.build.cache_clear()


def test_a_source_is_compiled_once_per_macro_set_and_loaded(tmp_path, cache):
    if native.compiler() is None:
        pytest.skip("no C compiler here")
    src = tmp_path / "twice.c"
    src.write_text(SOURCE)
    lib = native.build(src, (("SCALE", 3),))
    lib.reslm_twice.argtypes, lib.reslm_twice.restype = [ctypes.c_int], ctypes.c_int
    assert lib.reslm_twice(5) == 30
    built = sorted(cache.glob("twice-*.so"))
    native.build.cache_clear()
    native.build(src, (("SCALE", 3),))                       # the cached library, not a new build
    assert sorted(cache.glob("twice-*.so")) == built and len(built) == 1
    native.build(src, (("SCALE", 4),))                       # other macros: another library
    src.write_text(SOURCE + "/* changed */\n")
    native.build.cache_clear()                               # (a process loads a source's library once)
    native.build(src, (("SCALE", 3),))                       # a changed source: another library
    assert len(list(cache.glob("twice-*.so"))) == 3 and [p.name for p in cache.glob(".*")] == [native.LOCK]
    assert len(list(cache.glob("twice-*.so" + native.RECORD))) == 3      # each with its record


def test_no_compiler_or_a_compiler_error_gives_none_and_says_why(tmp_path, cache, monkeypatch):
    src = tmp_path / "broken.c"
    src.write_text("int reslm_broken( {\n")
    if native.compiler() is not None:
        assert native.build(src, ()) is None
        assert "failed on broken.c" in native.why_not(src)
        assert not list(cache.glob("broken-*"))              # nothing half-made left behind
    native.build.cache_clear()
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert native.compiler() is None
    assert native.build(src, ()) is None and native.why_not(src).startswith("CC=")
    assert str(tmp_path / "no-such-cc") in native.why_not(src)


def test_the_target_is_native_unless_reslm_march_names_another(monkeypatch):
    from reslm.core.errors import ReslmError
    monkeypatch.delenv("RESLM_MARCH", raising=False)
    assert native.march() == "native"
    monkeypatch.setenv("RESLM_MARCH", "haswell")
    assert native.march() == "haswell"
    if native.compiler() is not None:
        assert native.vector_floats() == 8                     # haswell: AVX2, no AVX-512
    monkeypatch.setenv("RESLM_MARCH", "haswell; rm -rf ~")
    with pytest.raises(ReslmError, match="RESLM_MARCH must be a compiler -march name"):
        native.march()


# --- the cache trusts only the files reslm built (issue 89) ------------------------------------------
FOREIGN = """#include <stdio.h>
__attribute__((constructor)) static void ran(void) { FILE *f = fopen(MARKER, "w"); if (f) fclose(f); }
int reslm_twice(int x) { return -1; }
"""


def _twice(lib) -> int:
    lib.reslm_twice.argtypes, lib.reslm_twice.restype = [ctypes.c_int], ctypes.c_int
    return lib.reslm_twice(5)


@pytest.fixture
def built(tmp_path, cache):
    """twice.c built once with SCALE 3: (source, the cached library's path)."""
    if native.compiler() is None:
        pytest.skip("no C compiler here")
    src = tmp_path / "twice.c"
    src.write_text(SOURCE)
    assert _twice(native.build(src, (("SCALE", 3),))) == 30
    native.build.cache_clear()
    (lib,) = cache.glob("twice-*.so")
    return src, lib


def _compile(tmp_path, text: str, name: str, *defines: str):
    import subprocess
    c = tmp_path / f"{name}.c"
    c.write_text(text)
    out = tmp_path / f"{name}.so"
    subprocess.run([native.compiler_command()[0], "-shared", "-fPIC", *defines, str(c), "-o", str(out)], check=True)
    return out


def test_a_foreign_library_under_the_cached_name_is_never_loaded_and_is_rebuilt(tmp_path, built):
    src, lib = built
    marker = tmp_path / "constructor-ran"
    foreign = _compile(tmp_path, FOREIGN, "foreign", f'-DMARKER="{marker}"')
    lib.write_bytes(foreign.read_bytes())
    assert _twice(native.build(src, (("SCALE", 3),))) == 30       # rebuilt: reslm's own code
    assert not marker.exists()                                   # the foreign constructor never ran


def test_a_hand_built_kernel_of_other_macros_under_the_name_is_rebuilt(tmp_path, built):
    src, lib = built
    other = _compile(tmp_path, SOURCE, "other", "-DSCALE=4")
    lib.write_bytes(other.read_bytes())
    assert _twice(native.build(src, (("SCALE", 3),))) == 30


def test_a_truncated_or_damaged_library_never_reaches_the_loader(tmp_path, built):
    src, lib = built
    body = lib.read_bytes()
    lib.write_bytes(body[:1000])                                 # cut: dlopen of it would SIGBUS or fail
    assert _twice(native.build(src, (("SCALE", 3),))) == 30
    assert lib.read_bytes() == body                              # built again, whole
    native.build.cache_clear()
    flipped = bytearray(body)
    flipped[len(body) // 2] ^= 0xFF
    lib.write_bytes(bytes(flipped))
    assert _twice(native.build(src, (("SCALE", 3),))) == 30 and lib.read_bytes() == body


def test_a_symlinked_library_is_not_followed(tmp_path, built):
    src, lib = built
    marker = tmp_path / "constructor-ran"
    foreign = _compile(tmp_path, FOREIGN, "foreign", f'-DMARKER="{marker}"')
    kept = foreign.read_bytes()
    lib.unlink()
    lib.symlink_to(foreign)
    assert _twice(native.build(src, (("SCALE", 3),))) == 30
    assert not marker.exists() and not lib.is_symlink() and foreign.read_bytes() == kept


def test_a_symlinked_or_shared_cache_folder_is_not_used(tmp_path, cache, monkeypatch):
    if native.compiler() is None:
        pytest.skip("no C compiler here")
    src = tmp_path / "twice.c"
    src.write_text(SOURCE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache.parent.mkdir(parents=True)
    cache.symlink_to(elsewhere, target_is_directory=True)
    assert native.build(src, (("SCALE", 3),)) is None
    assert "is a symlink" in native.why_not(src) and not list(elsewhere.iterdir())   # nothing written there
    cache.unlink()
    cache.mkdir()
    cache.chmod(0o777)
    native.build.cache_clear()
    assert native.build(src, (("SCALE", 3),)) is None
    assert "writable by group" in native.why_not(src) and not list(cache.iterdir())
    cache.chmod(0o755)                                           # this user's, read-only to others: used
    native.build.cache_clear()
    assert _twice(native.build(src, (("SCALE", 3),))) == 30


def test_a_killed_builds_temp_file_is_removed_by_the_next_build(tmp_path, built):
    src, lib = built
    stale = lib.parent / f"{native.TEMP_PREFIX}12345-{lib.name}"
    stale.write_bytes(b"")                                       # what a build killed mid-compile leaves
    lib.unlink()                                                 # so that the next call builds
    assert _twice(native.build(src, (("SCALE", 3),))) == 30
    assert not list(lib.parent.glob(native.TEMP_PREFIX + "*"))


def test_cc_may_carry_words_after_the_compiler(tmp_path, cache, monkeypatch):
    if native.compiler() is None:
        pytest.skip("no C compiler here")
    cc = native.compiler_command()[0]
    src = tmp_path / "twice.c"
    src.write_text(SOURCE)
    monkeypatch.setenv("CC", f"{cc} -g0")                        # as CC='ccache gcc' is given to make
    assert native.compiler_command() == [cc, "-g0"]
    assert _twice(native.build(src, (("SCALE", 3),))) == 30
    native.build.cache_clear()
    monkeypatch.setenv("CC", "ccache-not-here gcc")
    assert native.build(src, (("SCALE", 3),)) is None
    assert native.why_not(src).startswith("CC='ccache-not-here gcc' names no program on PATH")


def test_two_libraries_loaded_one_after_the_other_are_each_their_own(tmp_path, cache):
    """Each library is loaded through the descriptor that was hashed: a second library must not be taken for
    the first because its descriptor number (and so its /proc/self/fd/N name) was the first one's."""
    if native.compiler() is None:
        pytest.skip("no C compiler here")
    src = tmp_path / "twice.c"
    src.write_text(SOURCE)
    assert [_twice(native.build(src, (("SCALE", k),))) for k in (3, 4, 5)] == [30, 40, 50]
