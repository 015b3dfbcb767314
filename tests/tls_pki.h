// A throwaway PKI made by the openssl tool at test time (tls_test, tls_reload_test):
//   ca      -> server (CN=127.0.0.1, SAN IP:127.0.0.1), client, admin, expired (2020-01-01..02)
//              (leaf CNs are tenant-<name>)
//   other   -> stranger (another CA's client)
//   rot     -> server2 (CN=127.0.0.1-rotated, serial 0x22), client2 (the rotated CA's client)
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"

namespace oscarkv::testing {

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class Pki {
 public:
  explicit Pki(const std::string& tag)
      : dir_(::testing::TempDir() + "/" + tag + "_pki_" + std::to_string(::getpid())) {
    const std::string d = dir_;
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
    std::filesystem::create_directories(d);
    // openssl ca (for the expired certificate's fixed dates) needs a database and a config.
    std::ofstream(d + "/ca.cnf") << "[ca]\ndefault_ca = d\n[d]\ndatabase = " << d
                                 << "/index.txt\nnew_certs_dir = " << d << "\nserial = " << d
                                 << "/serial\ndefault_md = sha256\npolicy = p\n"
                                 << "[p]\ncommonName = supplied\n";
    std::ofstream(d + "/san.cnf") << "subjectAltName = IP:127.0.0.1, DNS:localhost\n";
    const std::string script =
        "set -e; cd " + d + "; : > index.txt; echo 01 > serial;"
        " for ca in ca other rot; do openssl req -x509" + ec + "-days 2 -subj /CN=$ca-ca"
        " -keyout $ca.key -out $ca.pem; done;"
        " openssl req" + ec + "-subj /CN=127.0.0.1 -keyout server.key -out server.csr;"
        " openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days 2"
        " -extfile san.cnf -out server.pem;"
        " openssl req" + ec + "-subj /CN=127.0.0.1-rotated -keyout server2.key -out server2.csr;"
        " openssl x509 -req -in server2.csr -CA rot.pem -CAkey rot.key -set_serial 34 -days 2"
        " -extfile san.cnf -out server2.pem;"
        " for c in client expired stranger client2 admin; do openssl req" + ec + "-subj /CN=tenant-$c"
        " -keyout $c.key -out $c.csr; done;"
        " openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -set_serial 3 -days 2"
        " -out client.pem;"
        " openssl x509 -req -in stranger.csr -CA other.pem -CAkey other.key -set_serial 4"
        " -days 2 -out stranger.pem;"
        " openssl x509 -req -in client2.csr -CA rot.pem -CAkey rot.key -set_serial 35 -days 2"
        " -out client2.pem;"
        " openssl x509 -req -in admin.csr -CA ca.pem -CAkey ca.key -set_serial 36 -days 2"
        " -out admin.pem;"
        " openssl ca -batch -config ca.cnf -cert ca.pem -keyfile ca.key -in expired.csr"
        " -out expired.pem -startdate 20200101000000Z -enddate 20200102000000Z -notext;"
        // Valid in its day: expiry is the only reason for refusing it.
        " openssl verify -CAfile ca.pem -no_check_time expired.pem;"
        " ! openssl verify -CAfile ca.pem expired.pem";
    ok_ = std::system(("bash -c '" + script + "' > " + d + "/openssl.log 2>&1").c_str()) == 0;
  }
  ~Pki() { std::filesystem::remove_all(dir_); }
  bool ok() const { return ok_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string pem(const std::string& name) const { return ReadFile(path(name)); }
  std::string log() const { return ReadFile(path("openssl.log")); }

 private:
  std::string dir_;
  bool ok_ = false;
};

}  // namespace oscarkv::testing
