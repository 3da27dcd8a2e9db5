# cmake/Dependencies.cmake — finds the design card's dependencies.
#
# Each is looked up through pkg-config and exposed as an imported target
# PkgConfig::<NAME>. A missing one stops configuration with the Debian package
# that provides it, so "apt-get install <pkg>" is the whole fix.
find_package(PkgConfig)
if(NOT PKG_CONFIG_FOUND)
  message(FATAL_ERROR "pkg-config not found: install the Debian package 'pkg-config' (apt-get install pkg-config)")
endif()

function(pc_require_pkg name module debpkg)
  pkg_check_modules(${name} QUIET IMPORTED_TARGET GLOBAL ${module})
  if(NOT ${name}_FOUND)
    message(FATAL_ERROR "missing dependency '${module}': install the Debian package '${debpkg}' (apt-get install ${debpkg}), or run ./scripts/deps.sh")
  endif()
  message(STATUS "found ${module} ${${name}_VERSION}")
endfunction()

pc_require_pkg(URING liburing liburing-dev)
pc_require_pkg(IBVERBS libibverbs libibverbs-dev)
pc_require_pkg(RDMACM librdmacm librdmacm-dev)
pc_require_pkg(MSGPACK msgpack libmsgpack-dev)
pc_require_pkg(XXHASH libxxhash libxxhash-dev)
if(PEERCACHE_BUILD_TESTS)
  pc_require_pkg(CRITERION criterion libcriterion-dev)
endif()
